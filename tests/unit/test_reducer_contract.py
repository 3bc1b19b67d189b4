"""The reducer contract in one process (no process group, no spawn) beyond the conformance
kit (``tests/conformance/test_single_worker.py``: one worker against each class's reference,
applied + kept = accumulated, state round trip, for every ``conf/reducer`` file): old
checkpoints, density changes, bad settings."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from hydra.utils import get_class

from baselines.ddp import DDPReducer
from baselines.fp16 import DDPFp16Reducer
from baselines.powersgd import PowerSGDReducer
from gtopk.reducers import DenseReducer, GTopKReducer, Reducer, TopKReducer
from gtopk.reducers.selection.exact import k_for
from gtopk.run.checks import ConfigError, reducer_settings
from gtopk.train.state import _reducer_state
from tests.config import options

M = 1000
DENSITY = 0.02  # k = 20 of 1000

SPARSE: dict[str, Callable[[], Reducer]] = {
    "topk": lambda: TopKReducer(DENSITY),
    "topk-reselect": lambda: TopKReducer(DENSITY, reselect=True),
    "gtopk-tree-index": lambda: GTopKReducer(DENSITY),
    "gtopk-tree-exact": lambda: GTopKReducer(DENSITY, putback="exact"),
    "gtopk-rd-index": lambda: GTopKReducer(DENSITY, algorithm="recursive_doubling"),
    "gtopk-rd-exact": lambda: GTopKReducer(DENSITY, algorithm="recursive_doubling", putback="exact"),
}
DENSE: dict[str, Callable[[], Reducer]] = {
    "dense": lambda: DenseReducer(bucket_mb=0.001),
    "ddp": DDPReducer,
    "ddp_fp16": DDPFp16Reducer,
    "powersgd": PowerSGDReducer,
}


def gradients(steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(M, generator=g) for _ in range(steps)]


@pytest.fixture(autouse=True)
def no_process_group():
    assert not dist.is_initialized(), "these tests need a process without a process group"


def test_state_dict_is_a_copy():
    r = TopKReducer(DENSITY)
    r.reduce(gradients(1)[0])
    saved = r.state_dict()["residual"]
    kept = saved.clone()
    r.reduce(gradients(1, seed=3)[0])  # the residual changes in place
    assert torch.equal(saved, kept)


def test_a_checkpoint_of_the_old_format_restores_the_residual():
    a, b = GTopKReducer(DENSITY), GTopKReducer(DENSITY)
    first, second = gradients(2, seed=4)
    a.reduce(first)
    b.load_state_dict(_reducer_state({"epoch": 0, "residual": a.state_dict()["residual"]}))
    assert torch.equal(a.reduce(second)[0], b.reduce(second)[0])
    d = DenseReducer()
    d.load_state_dict(_reducer_state({"epoch": 0, "residual": None}))  # a dense run's old checkpoint
    with pytest.raises(ValueError, match="keeps no state"):
        d.load_state_dict({"residual": torch.zeros(M)})


@pytest.mark.parametrize("name", SPARSE)
def test_a_density_change_takes_effect_on_the_next_reduce(name):
    r = SPARSE[name]()
    g1, g2 = gradients(2, seed=5)
    _, rec = r.reduce(g1)
    assert rec.selected == k_for(DENSITY, M)
    r.density = 0.25
    update, rec = r.reduce(g2)
    assert r.density == 0.25 and rec.selected == 250 and torch.count_nonzero(update) == 250


@pytest.mark.parametrize("name", DENSE)
def test_dense_reducers_accept_a_density_and_send_everything(name):
    r = DENSE[name]()
    r.density = 0.01
    _, rec = r.reduce(gradients(1)[0])
    assert r.density == 1.0 and rec.selected == M


@pytest.mark.parametrize("make", {**SPARSE, **DENSE}.values(), ids=[*SPARSE, *DENSE])
@pytest.mark.parametrize("bad", [0, 1.5, -0.1, float("nan"), "abc", None])
def test_a_bad_density_is_a_one_line_error_and_changes_nothing(make, bad):
    r = make()
    before = r.density
    with pytest.raises(ValueError, match=r"density=.*set density to a value in \(0, 1\]") as e:
        r.density = bad
    assert "\n" not in str(e.value) and r.density == before


@pytest.mark.parametrize(
    "make,setting",
    [
        (lambda: TopKReducer(density=0), "density"),
        (lambda: GTopKReducer(density=2.0), "density"),
        (lambda: GTopKReducer(DENSITY, algorithm="ring"), "reducer.algorithm"),
        (lambda: GTopKReducer(DENSITY, putback="none"), "reducer.putback"),
        (lambda: DenseReducer(bucket_mb=0), "reducer.bucket_mb"),
        (lambda: DDPReducer(bucket_mb=-1), "reducer.bucket_mb"),
        (lambda: DDPFp16Reducer(bucket_mb=0), "reducer.bucket_mb"),
        (lambda: DDPFp16Reducer(dtype="float8"), "reducer.dtype"),
        (lambda: PowerSGDReducer(matrix_approximation_rank=0), "reducer.matrix_approximation_rank"),
        (lambda: PowerSGDReducer(start_powerSGD_iter=1), "reducer.start_powerSGD_iter"),
        (lambda: PowerSGDReducer(use_error_feedback="yes"), "reducer.use_error_feedback"),
        (lambda: PowerSGDReducer(min_compression_rate="x"), "reducer.min_compression_rate"),
        (lambda: PowerSGDReducer(bucket_mb=0), "reducer.bucket_mb"),
    ],
)
def test_bad_settings_raise_in_the_constructor(make, setting):
    with pytest.raises(ValueError, match=setting) as e:
        make()
    assert "\n" not in str(e.value)


def test_powersgd_may_start_at_one_without_error_feedback_or_warm_start():
    r = PowerSGDReducer(start_powerSGD_iter=1, use_error_feedback=False, warm_start=False)
    assert r.settings["start_powerSGD_iter"] == 1 and r.state_dict() == {}  # one worker: no hook, no state


@pytest.mark.parametrize("reducer", options("reducer"))
def test_reducer_settings_accepts_every_config_and_refuses_a_bad_density(compose, reducer):
    """Every ``conf/reducer`` file's settings pass in the parent; a reducer that uses the
    density refuses density=0 there, in one line naming it."""
    cfg = compose([f"reducer={reducer}", "density=0.01"])
    assert reducer_settings(cfg) is None
    if get_class(cfg.reducer._target_).uses_density:
        with pytest.raises((ConfigError, ValueError), match="density") as e:
            reducer_settings(compose([f"reducer={reducer}", "density=0"]))
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "override,setting", [("reducer.algorithm=ring", "reducer.algorithm"), ("reducer.putback=x", "reducer.putback")]
)
def test_reducer_settings_names_a_bad_setting_in_one_line(compose, override, setting):
    with pytest.raises(ConfigError, match=setting) as e:
        reducer_settings(compose(["reducer=gtopk", override]))
    assert "\n" not in str(e.value)
