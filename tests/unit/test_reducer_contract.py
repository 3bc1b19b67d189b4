"""The reducer contract in one process (no process group, no spawn): one worker, the
semantics of ``gtopk.reducers.reference`` at P=1, error-feedback state, density, settings."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from baselines.ddp import DDPReducer
from baselines.fp16 import DDPFp16Reducer
from baselines.powersgd import PowerSGDReducer
from gtopk.reducers import DenseReducer, GTopKReducer, Reducer, TopKReducer, reference
from gtopk.reducers.selection import k_for
from gtopk.run.checks import ConfigError, reducer_settings
from gtopk.train.state import _reducer_state

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


def reference_step(name: str, acc: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(update, residual) of ``gtopk.reducers.reference`` for one worker."""
    if name.startswith("topk"):
        update, (residual,) = reference.topk([acc], k, reselect=name == "topk-reselect")
    else:
        _, algorithm, putback = name.split("-")
        algorithm = {"rd": "recursive_doubling"}.get(algorithm, algorithm)
        update, (residual,) = reference.gtopk([acc], k, algorithm=algorithm, putback=putback)
    return update, residual


def gradients(steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(M, generator=g) for _ in range(steps)]


@pytest.fixture(autouse=True)
def no_process_group():
    assert not dist.is_initialized(), "these tests need a process without a process group"


@pytest.mark.parametrize("make", {**SPARSE, **DENSE}.values(), ids=[*SPARSE, *DENSE])
def test_without_a_process_group_a_reducer_is_one_worker(make):
    r = make()
    assert (r.world_size, r.rank, r.distributed) == (1, 0, False)


@pytest.mark.parametrize("name", DENSE)
def test_dense_at_one_worker_sends_the_gradient_and_keeps_nothing(name):
    r = DENSE[name]()
    for g in gradients(3):
        update, rec = r.reduce(g)
        expected, (residual,) = reference.dense([g])
        assert torch.equal(update, expected) and not residual.any()
        assert rec.selected == M
        assert r.state_dict() == {}


@pytest.mark.parametrize("name", SPARSE)
def test_sparse_at_one_worker_equals_the_reference_bit_for_bit(name):
    r = SPARSE[name]()
    residual = torch.zeros(M)
    for g in gradients(5):
        update, rec = r.reduce(g)
        expected, residual = reference_step(name, residual + g, k_for(DENSITY, M))
        assert torch.equal(update, expected)
        assert torch.equal(r.state_dict()["residual"], residual)
        assert rec.selected == k_for(DENSITY, M)


@pytest.mark.parametrize("name", SPARSE)
def test_sent_plus_kept_is_what_was_accumulated(name):
    r = SPARSE[name]()
    old = torch.zeros(M)
    for g in gradients(6, seed=1):
        update, _ = r.reduce(g)
        new = r.state_dict()["residual"]
        assert torch.equal(update + new, old + g)
        assert torch.count_nonzero(update) == k_for(DENSITY, M)  # the selected entries, nothing else
        old = new


@pytest.mark.parametrize("name", SPARSE)
def test_a_fresh_reducer_loaded_with_anothers_state_takes_the_same_next_step(name):
    first, *rest = gradients(4, seed=2)
    a, b = SPARSE[name](), SPARSE[name]()
    assert a.state_dict() == {"residual": None}
    a.reduce(first)
    b.load_state_dict(a.state_dict())
    for g in rest:
        (ua, _), (ub, _) = a.reduce(g), b.reduce(g)
        assert torch.equal(ua, ub)
        assert torch.equal(a.state_dict()["residual"], b.state_dict()["residual"])


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


@pytest.mark.parametrize("reducer", ["dense", "topk", "gtopk", "ddp", "ddp_fp16", "powersgd"])
def test_reducer_settings_accepts_valid_settings_in_the_parent(compose, reducer):
    reducer_settings(compose([f"reducer={reducer}", "density=0.01"]))


@pytest.mark.parametrize(
    "override,setting", [("reducer.algorithm=ring", "reducer.algorithm"), ("reducer.putback=x", "reducer.putback")]
)
def test_reducer_settings_names_a_bad_setting_in_one_line(compose, override, setting):
    with pytest.raises(ConfigError, match=setting) as e:
        reducer_settings(compose(["reducer=gtopk", override]))
    assert "\n" not in str(e.value)
