"""``selection=sampled`` on a GPU (``make test-gpu``; skipped, with its reason, without one):
the same code on CUDA tensors (one full-size candidate mask instead of the CPU's chunked
scan; the torch path of the padding) selects and pads exactly what it does on the CPU.
``make test`` runs both code paths on the CPU (``tests/unit/test_selection_sampled.py``)."""

from __future__ import annotations

import pytest
import torch

from gtopk.reducers.selection import Selector, select

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; torch.cuda.is_available() is False here")
    return torch.device("cuda")


@pytest.mark.parametrize("m", [269_722, 14_728_266])  # ResNet-20's and VGG-16's gradients
def test_sampled_on_cuda_equals_the_cpu(cuda, m):
    g = torch.Generator().manual_seed(m)
    k = int(0.001 * m)
    for x in (torch.randn(m, generator=g), torch.randint(-50, 51, (m,), generator=g).float()):
        for method in ("exact", "sampled"):
            want = select(x, k, method)
            got = select(x.to(cuda), k, method)
            assert got.device.type == "cuda" and torch.equal(got.cpu(), want), (m, method)
        want, got = Selector("sampled").pick(x, k), Selector("sampled").pick(x.to(cuda), k)
        assert torch.equal(got.idx.cpu(), want.idx) and torch.equal(got.val.cpu(), want.val)
        assert (got.pad is None) == (want.pad is None)
        if want.pad is not None:
            assert torch.equal(got.pad.cpu(), want.pad)
