"""Bad input: clear errors naming the setting, before any process is spawned where
possible, and no hang where a rank's input differs from the others'."""

from __future__ import annotations

import multiprocessing

import pytest

from gtopk.launch import WorkerError, spawn
from gtopk.reducers import DenseReducer, GTopKReducer, TopKReducer, validate_density
from tests.workers import bad_gradient, fail_on_rank1


@pytest.mark.parametrize("density", [0, -0.1, 1.5, float("nan"), "abc", None])
@pytest.mark.parametrize("cls", [TopKReducer, GTopKReducer])
def test_density_outside_0_1_is_rejected_without_processes(cls, density):
    with pytest.raises(ValueError, match=r"density=.*\(0, 1\]"):
        cls(density=density)


def test_validate_density_accepts_the_range():
    assert validate_density(1) == 1.0 and validate_density("0.001") == 0.001


@pytest.mark.parametrize("setting,value", [("algorithm", "ring"), ("putback", "none")])
def test_unknown_gtopk_setting_lists_choices(setting, value):
    with pytest.raises(ValueError, match=f"reducer.{setting}='{value}'.*choose one of"):
        GTopKReducer(density=0.01, **{setting: value})


def test_reducer_needs_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        DenseReducer()


@pytest.mark.parametrize("kind", ["dense", "topk", "gtopk"])
@pytest.mark.parametrize("mode,error", [("size", "ValueError: gradient sizes differ"),
                                        ("dtype", "TypeError: reducer input must be one flat")])
def test_mismatched_gradients_fail_on_every_rank_without_hanging(kind, mode, error):
    out = spawn(bad_gradient, 2, (kind, mode), timeout=60)
    for msg in out:
        assert msg.startswith(error), msg
    if mode == "dtype":
        assert "rank 1: dtype torch.int64" in out[0] and ".float()" in out[0]
    else:
        assert "rank 0: 100, rank 1: 101" in out[0]


@pytest.mark.parametrize("how,text", [("raise", "injected failure on rank 1"), ("kill", "exited with code -9")])
def test_a_failing_rank_stops_the_group(how, text):
    """The others are blocked in a collective; spawn terminates them and reports rank 1."""
    with pytest.raises(WorkerError) as info:
        spawn(fail_on_rank1, 3, (how,), timeout=60, grace=2)
    assert text in info.value.failures[1]
    assert set(info.value.failures) == {0, 1, 2}  # the others: their own gloo error, or stopped
    assert not multiprocessing.active_children()
