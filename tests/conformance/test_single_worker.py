"""The single-worker contract of every ``conf/reducer`` config (no process group, one
process): one worker's ``reduce`` against the class's ``reference`` over steps with the
residual carried; for error-feedback reducers, what was applied plus what was kept is what
was accumulated, bit for bit (within ``feedback_tolerance`` where the class declares one); and a fresh reducer loaded with another's ``state_dict``
takes the same next step (what a resumed job relies on)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hydra.utils import instantiate

from gtopk.perf.schedulecheck import same_update
from tests.conformance import kit

pytestmark = pytest.mark.conformance


@pytest.fixture(autouse=True)
def no_process_group():
    assert not dist.is_initialized(), "the single-worker contract needs a process without a process group"


def test_one_worker_is_rank_0_of_1(reducer_node):
    r = instantiate(reducer_node)
    assert (r.world_size, r.rank, r.distributed) == (1, 0, False)


def test_one_worker_applies_what_its_reference_says(reducer_node):
    if skip := kit.reference_skip(reducer_node):
        pytest.skip(skip)
    r = instantiate(reducer_node)
    kept = None
    for it in range(kit.STEPS):
        (g,) = kit.gradients(1, it)
        want, want_kept = r.reference([g], kept)
        update, _ = r.reduce(g.clone())
        assert same_update(type(r), update, want), f"step {it}"
        mine = kit.residual(r)
        assert mine is None or torch.equal(mine, want_kept[0]), f"step {it}: residual"
        kept = want_kept


def test_applied_plus_kept_is_what_was_accumulated(reducer_node):
    r = instantiate(reducer_node)
    old = torch.zeros(kit.M)
    for it in range(kit.STEPS):
        (g,) = kit.gradients(1, it)
        update, _ = r.reduce(g.clone())
        kept = kit.residual(r)
        if kept is None:  # no error feedback: one worker applies its whole gradient
            assert torch.equal(update, g), f"step {it}: a reducer without a residual must apply the gradient"
            continue
        if (tol := type(r).feedback_tolerance) is None:  # a selection rounds nothing: bit for bit
            assert torch.equal(update + kept, old + g), f"step {it}: applied + kept != residual + gradient"
        else:  # a quantizer's c + (p - c) rounds: within what the class declares
            torch.testing.assert_close(update + kept, old + g, rtol=tol[0], atol=tol[1], msg=f"step {it}")
        assert torch.count_nonzero(update) > 0, f"step {it}: nothing applied"
        old = kept


def test_a_fresh_reducer_loaded_with_the_state_takes_the_same_next_step(reducer_node):
    a, b = instantiate(reducer_node), instantiate(reducer_node)
    first, *rest = (kit.gradients(1, it)[0] for it in range(kit.STEPS))
    a.reduce(first.clone())
    b.load_state_dict(a.state_dict())
    for g in rest:
        (ua, _), (ub, _) = a.reduce(g.clone()), b.reduce(g.clone())
        assert torch.equal(ua, ub)
        sa, sb = kit.residual(a), kit.residual(b)
        assert (sa is None) == (sb is None) and (sa is None or torch.equal(sa, sb))
