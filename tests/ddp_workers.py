"""Worker functions for the DDP timing tests (module level, so that the processes that
``gtopk.run.spawn.spawn`` starts can import them). Each returns plain data."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from baselines.ddp import DDPReducer

#: parameters > 10 buckets of BUCKET_MB: several all-reduces in flight during backward
BUCKET_MB = 0.05


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 14 * 14, 64), nn.ReLU(), nn.Linear(64, 10)
    )


def _step(net: nn.Module, model: nn.Module, rank: int, backward) -> list[torch.Tensor]:
    """One SGD step on this rank's own batch; returns the averaged gradients and weights."""
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(8, 3, 16, 16, generator=gen), torch.randint(0, 10, (8,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    backward(F.cross_entropy(net(x), y))
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return grads + [p.detach().clone() for p in model.parameters()]


def hooked_and_plain_ddp(rank: int, P: int) -> dict:
    """Collective. The same step through torch DDP as it is, and through ``DDPReducer``'s
    wrapper with its timing hook; returns both results and what the hook measured."""
    plain_model = _model()
    plain = DistributedDataParallel(plain_model, bucket_cap_mb=BUCKET_MB, broadcast_buffers=False)
    plain_out = _step(plain, plain_model, rank, torch.Tensor.backward)
    reducer = DDPReducer(bucket_mb=BUCKET_MB)
    hooked_model = _model()
    hooked = reducer.wrap(hooked_model)
    timing = reducer.hooked_backward
    hooked_out = _step(hooked, hooked_model, rank, timing.run)
    commu = timing.take()
    return {"plain": plain_out, "hooked": hooked_out, "exposed": commu.exposed, "total": commu.total}
