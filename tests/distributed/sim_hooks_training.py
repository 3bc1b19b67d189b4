"""One small training run with a DDP hook baseline, twice: on P real processes (DDP with
torch's hook inside ``baselines``' timing hook, gloo) and on P virtual ranks of this process
(``reduce_group``: torch's hook on ``gtopk.simulated.hooks``'s buckets and group).

A convolution, two linear layers and their biases (PowerSGD compresses the convolution and
the hidden linear layer's weights and sends the rest as they are), no batch norm, in float64
unless said otherwise, plain SGD; each rank's batch is drawn from its own seeded generator
per step, so both runs see the same data. ``real_run`` is the worker function
(``gtopk.run.spawn``: one group of processes for every P), ``simulated_run`` the
in-process one. Both return the per-rank losses
per step, the final weights and the layout of every bucket each step (parameter indices).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from baselines.fp16 import DDPFp16Reducer
from baselines.powersgd import PowerSGDReducer

REDUCERS = {"ddp_fp16": DDPFp16Reducer, "powersgd": PowerSGDReducer}
INPUT = (2, 8, 8)
BATCH = 8


@dataclass(frozen=True)
class Setting:
    """One reducer setting trained for ``steps`` steps."""

    reducer: str
    options: dict = field(default_factory=dict)
    steps: int = 20
    dtype: str = "float64"
    bucket_mb: float = 0.0004  # 419 bytes: the 4,844 parameters in 4 buckets (float64; 3 in float32)
    lr: float = 0.05

    @property
    def name(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.reducer}[{self.dtype}{',' + opts if opts else ''}]"


class Net(nn.Module):
    """Registered out of the order it runs in: DDP's rebuilt buckets follow backward's order."""

    def __init__(self):
        super().__init__()
        self.out = nn.Linear(16, 4)
        self.conv = nn.Conv2d(INPUT[0], 8, 3)
        self.hidden = nn.Linear(8 * 6 * 6, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.hidden(F.relu(self.conv(x)).flatten(1))))


def model(setting: Setting) -> nn.Module:
    torch.manual_seed(0)
    return Net().to(getattr(torch, setting.dtype))


def reducer(setting: Setting, group=None):
    return REDUCERS[setting.reducer](**setting.options, bucket_mb=setting.bucket_mb, group=group)


def batch(setting: Setting, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, *INPUT, generator=g, dtype=getattr(torch, setting.dtype))
    return x, torch.randint(0, 4, (BATCH,), generator=g)


def real_run(rank: int, world: int, settings: list[Setting], sizes: tuple[int, ...]) -> dict:
    """Worker function: every setting on this rank of a real group (DDP, gloo) of each
    size P in ``sizes`` (ranks 0 to P - 1 of the world; the others wait). Float32 settings
    also return each step's record (``reduce`` after backward, as the loop calls it)."""
    out: dict = {"threads": torch.get_num_threads()}
    for P in sizes:
        group = None if P == world else dist.new_group(list(range(P)))  # collective: every rank
        if rank < P:
            out[P] = {s.name: train_real(s, rank, group) for s in settings}
    return out


def train_real(setting: Setting, rank: int, group) -> dict:
    net = model(setting)
    red = reducer(setting, group)
    ddp = red.wrap(net)
    run: dict = {"losses": [], "layouts": [], "records": []}
    red.hooked_backward.communicate = _noting_layouts(red.communicate, net, run["layouts"])
    opt = torch.optim.SGD(net.parameters(), lr=setting.lr)
    for step in range(setting.steps):
        x, y = batch(setting, rank, step)
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        red.hooked_backward.run(loss)
        run["losses"].append(loss.item())
        if setting.dtype == "float32":
            _, rec = red.reduce(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
            run["records"].append(traffic(rec))
        opt.step()
    run["weights"] = [p.detach().clone() for p in net.parameters()]
    return run


def _noting_layouts(communicate, net: nn.Module, layouts: list):
    """``communicate`` that first notes each bucket's parameters (by index), per step."""
    index = {id(p): i for i, p in enumerate(net.parameters())}

    def noted(state, bucket):
        if bucket.index() == 0:
            layouts.append([])
        layouts[-1].append([index[id(p)] for p in bucket.parameters()])
        return communicate(state, bucket)

    return noted


def traffic(rec) -> dict:
    """What a record says was sent."""
    keys = ("selected", "payload_bytes", "bytes_sent", "bytes_recv", "messages_sent")
    return {k: getattr(rec, k) for k in keys}


def simulated_run(setting: Setting, world: int, start: int = 0, steps: int | None = None, workers=None, net=None):
    """The same run on ``world`` virtual ranks of this process, steps ``start`` to
    ``start + steps`` (all of the setting's by default). ``workers`` and ``net``: these
    reducers (already ``prepare_group``'d) and model instead of new ones."""
    net = net if net is not None else model(setting)
    params = list(net.parameters())
    if workers is None:
        workers = [reducer(setting) for _ in range(world)]
        type(workers[0]).prepare_group(workers, net, INPUT)
    opt = torch.optim.SGD(params, lr=setting.lr)
    run: dict = {"losses": [], "layouts": [], "records": [], "workers": workers, "net": net}
    shared = workers[0].simulation
    for step in range(start, start + (setting.steps if steps is None else steps)):
        grads, row = [], []
        for rank in range(world):
            x, y = batch(setting, rank, step)
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            row.append(loss.item())
            grads.append(torch.cat([p.grad.reshape(-1) for p in params]))
        if shared is not None:
            run["layouts"].append(shared.first if shared.steps == 0 else shared.rebuilt)
        update, recs = type(workers[0]).reduce_group(workers, grads)
        at = 0
        for p in params:
            p.grad.copy_(update[at : at + p.numel()].view_as(p))
            at += p.numel()
        opt.step()
        run["losses"].append(row)
        run["records"].append([traffic(r) for r in recs])
    run["weights"] = [p.detach().clone() for p in params]
    return run
