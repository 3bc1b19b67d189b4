"""Every ``conf/reducer`` config on real worker processes (gloo on loopback), through the
training loop's call (backward through ``wrap``, then ``reduce(flat, out=flat)``): the
update and each rank's residual against the class's ``reference`` at every step, the same
update on every rank, and, for simulatable classes, ``reduce_group`` (P ranks in one
process, ``cluster=simulated``) against the real ranks: bit for bit, or within the kit's
tolerance (``gtopk.perf.schedulecheck.same_update``). ``make test``: P = 3 (not a power of
two); slow: P = 2, 4, 8."""

from __future__ import annotations

import pytest
import torch

from gtopk.perf.schedulecheck import same_update
from gtopk.run.spawn import spawn
from tests.conformance import kit

pytestmark = pytest.mark.conformance


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(2, marks=pytest.mark.slow),
        3,
        pytest.param(4, marks=pytest.mark.slow),
        pytest.param(8, marks=pytest.mark.slow),
    ],
    ids=lambda p: f"P{p}",
)
def group_run(request) -> tuple[int, list[dict]]:
    """One worker group of P real processes runs every config's steps."""
    P = request.param
    return P, spawn(kit.real_steps, P, ({n: kit.node(n) for n in kit.names()},), timeout=300)


def test_update_and_residuals_match_the_reference(group_run, name):
    P, out = group_run
    if skip := kit.reference_skip(kit.node(name)):
        pytest.skip(skip)
    failures = [f for o in out for f in o[name]["failures"]]
    assert not failures, "\n".join(failures[:10])


def test_every_rank_applies_the_same_update(group_run, name):
    P, out = group_run
    for rank, o in enumerate(out[1:], 1):
        for it, (u, u0) in enumerate(zip(o[name]["updates"], out[0][name]["updates"])):
            assert torch.equal(u, u0), f"rank {rank} step {it}"


def test_simulated_ranks_apply_what_real_ranks_apply(group_run, name):
    P, out = group_run
    n = kit.node(name)
    if skip := kit.simulated_skip(n):
        pytest.skip(skip)
    for it, (sim, real) in enumerate(zip(kit.simulated_updates(n, P), out[0][name]["updates"])):
        assert same_update(kit.cls_of(n), sim, real), (
            f"step {it}: max diff {(sim - real).abs().max().item():.3g} at value {real.flatten()[(sim - real).abs().argmax()].item():.6g}"
        )
