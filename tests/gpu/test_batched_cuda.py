"""The batched simulation on a GPU (``make test-gpu``; skipped, with its reason, without
one): both engines of ``cluster.batched`` (``gtopk.simulated.rankpass``'s one pass, vmap) give
each rank its own gradient and BatchNorm statistics on CUDA, as autograd one rank at a time
does, in float64 (cuDNN's TF32 does not apply). ``make test`` checks the same on the CPU
(``tests/unit/test_batched.py``); what only this tier shows is that the grouped weight
gradient and the rank-interleaved batch norm run on the device's kernels."""

from __future__ import annotations

import copy

import pytest
import torch

from gtopk.simulated.batched import BatchedGradients
from gtopk.train.models import ResNet20
from tests.unit.test_batched import Mixed, one_by_one, rel

pytestmark = pytest.mark.gpu


def check_engine(device: str, net, fast: bool, tol: float = 1e-10) -> None:
    """P = 5 ranks in chunks of 2, 3 images each, 2 micro-batches, on ``device``."""
    torch.manual_seed(0)
    model = net().to(device=device, dtype=torch.float64).train()
    start = [b.detach().clone() for b in model.buffers()]
    P, micro = 5, 2
    batches = [
        [
            (torch.randn(3, 3, 8, 8, dtype=torch.float64, device=device), torch.randint(0, 10, (3,), device=device))
            for _ in range(micro)
        ]
        for _ in range(P)
    ]
    batched = BatchedGradients(copy.deepcopy(model), P, chunk=2, fast=fast)
    assert (batched.fast is not None) == fast
    losses = batched.compute(batches)
    want_grads, want_buffers, want_losses = one_by_one(model, batches, start)
    for i in range(P):
        assert batched.grads[i].device.type == torch.device(device).type
        assert rel(batched.grads[i], want_grads[i]) < tol, i
        assert losses[i].item() == pytest.approx(want_losses[i], rel=tol)
        for got, want in zip(batched.rank_buffers(i), want_buffers[i]):
            assert rel(got, want) < tol if want.is_floating_point() else torch.equal(got, want), i


@pytest.mark.parametrize(
    "net,fast",
    [(ResNet20, True), (ResNet20, False), (Mixed, True)],  # vmap cannot run Mixed's cumulative-average batch norm
    ids=["resnet20-one-pass", "resnet20-vmap", "mixed-one-pass"],
)
def test_both_engines_give_each_rank_its_gradient_on_cuda(net, fast):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; torch.cuda.is_available() is False here")
    check_engine("cuda", (lambda: ResNet20(blocks_per_stage=1)) if net is ResNet20 else net, fast)
