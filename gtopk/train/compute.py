"""Where t_compute comes from: real forward/backward, or a replay of a profile.

``compute=measured`` (``MeasuredCompute``): every step runs forward and backward on real
batches. ``compute=replay`` (``ReplayedCompute``): every step fills the gradients with a
fixed per-rank random vector (the real reducer then aggregates it over the real network)
and sleeps until ``t_compute`` has passed, so P workers share a few cores without their
compute contending. The sleep is in the worker's virtual time (``gtopk.host.sleep``):
under time dilation D (``cluster.dilation``) it lasts t_compute x D on the wall. A model wrapped for backward hooks (DDP) gets a replayed
backward pass instead (``gtopk.train.replay_backward``), so that its communication happens and
overlaps as it would. ``t_compute`` comes from a *compute profile*:

* ``p102``: the paper's single-node throughput (``gtopk.paper``) with this job's images
  per step: t_compute = batch * accumulation / (images/s of one P102-100);
* ``local``: measured by the harness at P = 1 on this machine (a short ``compute=measured``
  benchmark, run once per model, batch and device by ``gtopk.run.localprofile`` before
  the job starts: ``MissingLocalProfile`` asks for it; cached in ``runs/profiles/local.json``);
* a path to a JSON file in the format of ``local.json``.

Replay is for throughput benchmarks only (there is no real loss to train on).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from gtopk import host
from gtopk.paper import single_node_throughput
from gtopk.records import profiles
from gtopk.records.profiles import ProfileError, profile_key, read_profile
from gtopk.train.replay_backward import replay_backward


class MissingLocalProfile(ProfileError):
    """The local profile has no entry for this job yet: the launcher measures it
    (``gtopk.run.localprofile``) and resolves again."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


class Compute(ABC):
    """How a step's gradient is produced (runs inside each worker; not collective)."""

    kind = "compute"
    needs_data = True
    #: whether ``device=auto`` puts the job on a GPU where there is one (real forward and
    #: backward do; a replay's sleep and random gradient need none: ``gtopk.run.checks.placement``)
    wants_gpu = True

    def resolve(self, cfg: Any) -> dict:
        """Called once per job before any worker starts (raise on bad settings); returns
        settings to write into the job's ``compute`` config (so records hold them)."""
        return {}

    def prepare(self, worker: Any) -> None:
        """Called in each worker once its model and parameters exist."""
        return None

    @abstractmethod
    def gradient(self, worker: Any, fetch: Callable[[], list]) -> tuple[float, float | None]:
        """Fill ``worker.params``' ``.grad``; return (t_data seconds, loss or None)."""

    def describe(self) -> dict:
        return {"compute": self.kind, "compute_profile": None}


class MeasuredCompute(Compute):
    """Real forward and backward over ``grad_accum`` micro-batches."""

    kind = "measured"

    def gradient(self, worker, fetch):
        t0 = worker.clock()
        batches = [(x.to(worker.device, non_blocking=True), y.to(worker.device, non_blocking=True)) for x, y in fetch()]
        t_data = worker.clock() - t0
        loss_sum = 0.0
        for x, y in batches:
            loss = F.cross_entropy(worker.net(x), y) / len(batches)
            worker.backward.run(loss)  # DDP: also times its all-reduces (gtopk.train.backward)
            loss_sum += loss.item()
        return t_data, loss_sum


class ReplayedCompute(Compute):
    """Sleep for the profile's t_compute; the gradient is a fixed random vector per rank.

    ``warmup_sleep``: whether the benchmark's warm-up steps (the first ``warmup_steps``
    calls, excluded from every summary) sleep t_compute too. They exist to warm up the
    communication and the buffers, which the sleep does nothing for; without it a
    ResNet-50 job (4.84 s per replayed step) saves 4.84 s per warm-up step. Timed steps
    always sleep t_compute.
    """

    kind = "replay"
    needs_data = False
    wants_gpu = False

    def __init__(
        self,
        profile: str = "p102",
        t_compute: float | None = None,
        grad_scale: float = 1e-3,
        warmup_sleep: bool = True,
        warmup_steps: int = 0,
    ):
        self.profile = str(profile)
        self.t_compute = None if t_compute is None else float(t_compute)
        self.grad_scale = grad_scale
        self.warmup_sleep = bool(warmup_sleep)
        self.warmup_steps = int(warmup_steps)
        self.steps = 0  # gradient() calls so far
        self.bank: torch.Tensor | None = None

    def describe(self) -> dict:
        return {"compute": self.kind, "compute_profile": self.profile, "t_compute_replayed": self.t_compute}

    def resolve(self, cfg: Any) -> dict:
        if cfg.mode != "benchmark":
            raise ProfileError(
                f"compute=replay with mode={cfg.mode}: replay has no real loss to train on; "
                "use mode=benchmark, or compute=measured to train"
            )
        if self.t_compute is None:
            self.t_compute = profile_t_compute(self.profile, cfg)
        if not self.t_compute > 0:
            raise ProfileError(f"compute.t_compute={self.t_compute!r} must be > 0 seconds")
        return {"t_compute": self.t_compute, "warmup_steps": int(cfg.benchmark.warmup)}

    def step_time(self) -> float:
        """Seconds the next step replays (counts the step): t_compute, or 0 for a warm-up
        step when ``warmup_sleep`` is off."""
        self.steps += 1
        warming_up = self.steps <= self.warmup_steps
        return 0.0 if warming_up and not self.warmup_sleep else self.t_compute

    def prepare(self, worker) -> None:
        for p in worker.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.bank = replay_gradient(worker.m, worker.cfg.seed, worker.rank, self.grad_scale, worker.device)

    def gradient(self, worker, fetch):
        t_compute = self.step_time()
        if worker.net is not worker.model:  # a wrapper that hooks into backward (DDP)
            replay_backward(worker.net, worker.model, worker.params, self.bank, t_compute, worker.backward.run)
            return 0.0, None
        start = host.now()
        offset = 0
        for p in worker.params:
            n = p.numel()
            p.grad.copy_(self.bank[offset : offset + n].view_as(p))
            offset += n
        worker.clock()  # waits for the copies on a GPU
        host.sleep(t_compute - (host.now() - start))  # virtual seconds: D x as long under time dilation
        return 0.0, None


#: the last replay gradient made in this process, by its arguments: the jobs of one model in
#: a sweep run one after another in the same worker processes (gtopk.run.runner) and read it
_LAST_GRADIENT: dict[tuple, torch.Tensor] = {}


def replay_gradient(m: int, seed: int, rank: int, scale: float, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s fixed replay gradient: ``scale`` x m standard normal values from a
    generator seeded by (seed, rank), on ``device``. Read only. The last one made is kept
    and returned again for the same arguments (the same values: it is a function of
    them), sparing a worker the 0.3 s (AlexNet) of drawing it per job, 1.2 s with 8 workers
    on 2 cores; asking for another drops it first."""
    key = (m, seed, rank, scale, str(device))
    if key not in _LAST_GRADIENT:
        _LAST_GRADIENT.clear()
        gen = torch.Generator().manual_seed(1_000_003 * (seed + 1) + rank)
        # scaled in place: no second model-sized temporary (the values of randn * scale)
        _LAST_GRADIENT[key] = torch.randn(m, generator=gen, device="cpu").mul_(scale).to(device)
    return _LAST_GRADIENT[key]


def images_per_step(cfg: Any) -> int:
    return int(cfg.batch_size) * int(cfg.grad_accum)


def profile_t_compute(profile: str, cfg: Any) -> float:
    """t_compute of this job's model and batch from ``profile`` (p102, local or a path)."""
    model, images = cfg.model_name, images_per_step(cfg)
    if profile == "p102":
        table = single_node_throughput()
        if model not in table:
            raise ProfileError(
                f"compute.profile=p102 has no single-node throughput for model={model} "
                f"(it has {', '.join(sorted(table))}); use compute.profile=local"
            )
        return images / table[model]
    path = profiles.LOCAL_PROFILE if profile == "local" else Path(profile)
    key = profile_key(cfg)
    entry = read_profile(path).get(key)
    if entry is None and profile == "local":
        raise MissingLocalProfile(
            f"compute.profile=local: {path} has no entry {key!r}; run.py measures it at P = 1 before the job starts",
            key,
        )
    if entry is None:
        raise ProfileError(
            f"compute.profile={profile}: {path} has no entry {key!r}; "
            "use compute.profile=local to measure it on this machine"
        )
    return images / float(entry["images_per_s"])
