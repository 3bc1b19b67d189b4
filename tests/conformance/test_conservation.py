"""Checks that hold for any compressor, independent of its own code and reference (a shared
helper with a bug passes the reference checks; it does not pass these):

* conservation: for a reducer that declares ``conserves`` and keeps a residual, over steps on
  P ranks (``reduce_group``), P x the sum of the updates plus the final residuals is the sum
  of every rank's gradients (float rounding aside);
* a dense-equivalent input: when every rank's gradient is the same k-sparse vector (k the
  reducer's own), a sparsifier applies exactly that vector, the mean of the gradients.
Both on P = 4 simulated ranks, for every ``simulatable`` config."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from gtopk.reducers.selection.exact import k_for
from tests.conformance import kit

pytestmark = pytest.mark.conformance
P = 4


def workers_of(n: dict) -> list:
    """P ranks' reducers of config ``n`` for ``reduce_group`` (skips a class that is not simulatable)."""
    if skip := kit.simulated_skip(n):
        pytest.skip(skip)
    cls = kit.cls_of(n)
    workers = [instantiate(n) for _ in range(P)]
    if hasattr(cls, "prepare_group"):
        cls.prepare_group(workers, kit.Flat(), (kit.M,))
    return workers


def test_what_is_applied_plus_what_is_kept_is_every_gradient(reducer_node):
    workers = workers_of(reducer_node)
    if not getattr(workers[0], "conserves", True):
        pytest.skip(f"{reducer_node['_target_']} declares that it does not conserve (conserves=False)")
    cls = kit.cls_of(reducer_node)
    applied, given = torch.zeros(kit.M, dtype=torch.float64), torch.zeros(kit.M, dtype=torch.float64)
    for it in range(kit.STEPS):
        grads = kit.gradients(P, it)
        given += torch.stack(grads).double().sum(0)
        update, _ = cls.reduce_group(workers, [g.clone() for g in grads])
        applied += P * update.double()
    kept = [kit.residual(w) for w in workers]
    total = applied if any(r is None for r in kept) else applied + torch.stack(kept).double().sum(0)
    # float32 rounding, or the class's declared tolerance (fp16), over every rank and step
    rtol, atol = cls.feedback_tolerance or cls.tolerance or (1e-5, 1e-6)
    torch.testing.assert_close(
        total, given, rtol=rtol, atol=atol * P * kit.STEPS, msg="P x updates + kept != gradients"
    )


def test_a_dense_equivalent_input_is_applied_as_it_is(reducer_node):
    workers = workers_of(reducer_node)
    if not getattr(workers[0], "uses_density", False):
        pytest.skip(f"{reducer_node['_target_']} does not sparsify")
    k = k_for(workers[0].density, kit.M)
    g = torch.zeros(kit.M)
    g[torch.randperm(kit.M, generator=torch.Generator().manual_seed(3))[:k]] = torch.linspace(1.0, 2.0, k)
    update, _ = kit.cls_of(reducer_node).reduce_group(workers, [g.clone() for _ in range(P)])
    torch.testing.assert_close(update, g, rtol=1e-6, atol=1e-7)
