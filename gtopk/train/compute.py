"""Where t_compute comes from: real forward/backward, or a replay of a profile.

``compute=measured`` (``MeasuredCompute``): every step runs forward and backward on real
batches. ``compute=replay`` (``ReplayedCompute``): every step fills the gradients with a
random vector (the real reducer then aggregates it over the real network) and sleeps until
``t_compute`` has passed, so P workers share a few cores without their compute contending.
The vector (``compute.gradient``): ``steady`` (the default) is a new one every step and
rank, part of it shared by the ranks, the first step's standing for the residual training
has accumulated (``ReplayedCompute.replayed``: what makes a threshold that Ok-Topk keeps
from one step select about as many entries in the next steps as in training,
docs/oktopk.md); ``fixed`` is the same vector every step (before ``steady``: under it
Ok-Topk's kept thresholds select 99 to 376 times k). The sleep is in the worker's virtual time (``gtopk.host.sleep``):
under time dilation D (``cluster.dilation``) it lasts t_compute x D on the wall. A model wrapped for backward hooks (DDP) gets a replayed
backward pass instead (``gtopk.train.replay_backward``), so that its communication happens and
overlaps as it would. ``t_compute`` comes from a *compute profile*:

* ``p102``: the paper's single-node throughput (``gtopk.paper``) with this job's images
  per step: t_compute = batch * accumulation / (images/s of one P102-100);
* ``local``: measured by the harness at P = 1 on this machine (a short ``compute=measured``
  benchmark, run once per model, batch and device by ``gtopk.run.measure_compute`` before
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
from gtopk.records import compute_profiles
from gtopk.records.compute_profiles import ProfileError, profile_key, read_profile
from gtopk.train.replay_backward import replay_backward


class MissingLocalProfile(ProfileError):
    """The local profile has no entry for this job yet: the launcher measures it
    (``gtopk.run.measure_compute``) and resolves again."""

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
            worker.backward.run(loss)  # DDP: also times its all-reduces (gtopk.reducers.backward)
            loss_sum += loss.item()
        return t_data, loss_sum


class ReplayedCompute(Compute):
    """Sleep for the profile's t_compute; the gradient is a random vector of this rank's.

    ``warmup_sleep``: whether the benchmark's warm-up steps (the first ``warmup_steps``
    calls, excluded from every summary) sleep t_compute too. They exist to warm up the
    communication and the buffers, which the sleep does nothing for; without it a
    ResNet-50 job (4.84 s per replayed step) saves 4.84 s per warm-up step. Timed steps
    always sleep t_compute.

    ``gradient``: ``steady`` or ``fixed`` (``GRADIENTS``; the module docstring, ``replayed``);
    ``shared``: the fraction of a steady gradient's variance that every rank draws alike;
    ``carry``: how many steps' gradients the first steady one stands for.
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
        gradient: str = "fixed",
        shared: float = 0.0,
        carry: float = 1.0,
    ):
        if gradient not in GRADIENTS:
            raise ProfileError(f"compute.gradient={gradient!r} is unknown; choose one of {', '.join(GRADIENTS)}")
        if not 0.0 <= float(shared) <= 1.0:
            raise ProfileError(f"compute.shared={shared!r} must be in [0, 1] (a fraction of the variance)")
        if not float(carry) >= 1.0:
            raise ProfileError(f"compute.carry={carry!r} must be >= 1 (steps the first gradient stands for)")
        self.profile = str(profile)
        self.t_compute = None if t_compute is None else float(t_compute)
        self.grad_scale = grad_scale
        self.warmup_sleep = bool(warmup_sleep)
        self.warmup_steps = int(warmup_steps)
        self.gradient_kind, self.shared, self.carry = gradient, float(shared), float(carry)
        self.steps = 0  # gradient() calls so far
        self.banks: list[torch.Tensor] = []

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
        self.banks = replay_banks(
            worker.m, worker.cfg.seed, worker.rank, self.grad_scale, worker.device, self.gradient_kind, self.shared
        )

    def replayed(self, step: int, m: int) -> tuple[list[torch.Tensor], float]:
        """Step ``step``'s gradient (counted from 0) as (views of m values, one per bank, to be
        summed; a factor): ``fixed``: the one bank's first m values, factor 1. ``steady``: the
        window of m values at offset ``step * STRIDE mod WINDOW`` of each bank (a new draw for
        every entry at every step, WINDOW steps apart at most), the rank's bank holding
        1 - ``shared`` of the variance and the seed's bank, the same on every rank, the rest;
        step 0's factor is sqrt(``carry``): the sum of ``carry`` steps' independent draws, as a
        residual that training has accumulated (an error-feedback reducer starts with none)."""
        if self.gradient_kind == "fixed":
            return [self.banks[0][:m]], 1.0
        offset = (step * STRIDE) % WINDOW
        return [b[offset : offset + m] for b in self.banks], (self.carry**0.5 if step == 0 else 1.0)

    def gradient(self, worker, fetch):
        step = self.steps
        t_compute = self.step_time()
        parts, factor = self.replayed(step, worker.m)
        if worker.net is not worker.model:  # a wrapper that hooks into backward (DDP)
            replay_backward(worker.net, worker.model, worker.params, parts, t_compute, worker.backward.run, factor)
            return 0.0, None
        start = host.now()
        offset = 0
        for p in worker.params:
            n = p.numel()
            p.grad.copy_(parts[0][offset : offset + n].view_as(p))
            for more in parts[1:]:
                p.grad.add_(more[offset : offset + n].view_as(p))
            if factor != 1.0:
                p.grad.mul_(factor)
            offset += n
        worker.clock()  # waits for the copies on a GPU
        host.sleep(t_compute - (host.now() - start))  # virtual seconds: D x as long under time dilation
        return 0.0, None


#: compute.gradient's values (``ReplayedCompute.replayed``)
GRADIENTS = ("steady", "fixed")
#: a steady bank holds m + WINDOW values; step t's gradient is the m at offset t * STRIDE mod WINDOW
WINDOW = 1 << 20
#: odd, so that steps 0 .. WINDOW - 1 get distinct offsets (about WINDOW x 0.618: far apart)
STRIDE = 648_055

#: the last replay banks made in this process, by their arguments (one of a rank's and one
#: shared): the jobs of one model in a sweep run one after another in the same worker
#: processes (gtopk.run.dispatch) and read them
_LAST_GRADIENT: dict[str, tuple[tuple, torch.Tensor]] = {}


def replay_banks(
    m: int, seed: int, rank: int, scale: float, device: torch.device, kind: str = "fixed", shared: float = 0.0
) -> list[torch.Tensor]:
    """The banks ``ReplayedCompute.replayed`` reads: ``fixed``: rank ``rank``'s m values;
    ``steady``: m + WINDOW values of the rank's scaled by sqrt(1 - ``shared``) and of the
    seed's (every rank's alike) by sqrt(``shared``), a bank of weight 0 left out."""
    if kind == "fixed":
        return [replay_gradient(m, seed, rank, scale, device)]
    weights = ((rank, 1.0 - shared), (None, shared))
    return [replay_gradient(m, seed, r, scale * w**0.5, device, WINDOW) for r, w in weights if w > 0]


def replay_gradient(
    m: int, seed: int, rank: int | None, scale: float, device: torch.device, extra: int = 0
) -> torch.Tensor:
    """Rank ``rank``'s replay bank: ``scale`` x (m + ``extra``) standard normal values from a
    generator seeded by (seed, rank), on ``device``; ``rank=None``: the seed's bank, the same
    on every rank. Read only. The last one made of a rank's (and of the seed's) is kept and
    returned again for the same arguments (the same values: it is a function of them),
    sparing a worker the 0.3 s (AlexNet) of drawing it per job, 1.2 s with 8 workers on 2
    cores; asking for another drops it first."""
    key = (m, seed, rank, scale, str(device), extra)
    slot = "seed" if rank is None else "rank"
    if slot not in _LAST_GRADIENT or _LAST_GRADIENT[slot][0] != key:
        _LAST_GRADIENT.pop(slot, None)
        gen = torch.Generator().manual_seed(1_000_003 * (seed + 1) + (-1 if rank is None else rank))
        # scaled in place: no second model-sized temporary (the values of randn * scale)
        _LAST_GRADIENT[slot] = (key, torch.randn(m + extra, generator=gen, device="cpu").mul_(scale).to(device))
    return _LAST_GRADIENT[slot][1]


def images_per_step(cfg: Any) -> int:
    return int(cfg.batch_size) * int(cfg.grad_accum)


def profile_t_compute(profile: str, cfg: Any) -> float:
    """t_compute of this job's model and batch from ``profile`` (p102, local or a path). A
    profile named by path may be another machine's: where it has no entry for this job's
    device, its one entry for the model and batch on another device is replayed."""
    model, images = cfg.model_name, images_per_step(cfg)
    if profile == "p102":
        table = single_node_throughput()
        if model not in table:
            raise ProfileError(
                f"compute.profile=p102 has no single-node throughput for model={model} "
                f"(it has {', '.join(sorted(table))}); use compute.profile=local"
            )
        return images / table[model]
    path = compute_profiles.LOCAL_PROFILE if profile == "local" else Path(profile)
    key = profile_key(cfg)
    table = read_profile(path)
    entry = table.get(key)
    if entry is None and profile != "local":
        # another machine's profile (a GPU's, say) replayed here: its device, not this job's
        same = {k: v for k, v in table.items() if k.rsplit("/", 1)[0] == key.rsplit("/", 1)[0]}
        if len(same) > 1:
            raise ProfileError(
                f"compute.profile={profile}: {path} has {', '.join(sorted(same))} for this model and batch "
                f"and none for {key!r}; keep one device's entries in the file"
            )
        entry = next(iter(same.values()), None)
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
