"""Model state across ranks: identical initial weights, per-epoch checkpoints (their files:
``gtopk.train.checkpoint``), the final weights' fingerprint."""

from __future__ import annotations

import hashlib
import sys

import torch
import torch.distributed as dist
from torch import nn

from gtopk.records.rundir import RunDir
from gtopk.train.checkpoint import Store, check_settings, choose, legacy_manifest, passed_over


def broadcast_and_check(model: nn.Module) -> None:
    """Collective. Make every rank hold rank 0's parameters and buffers, then check that all
    ranks hold identical weights (all_reduce of a checksum's min and max). Ranks that built
    the model from the same seed already agree, and then nothing is broadcast (a model-sized
    broadcast per job: 10 s for AlexNet at P = 8 on the emulated 1 Gbit/s network)."""
    tensors = list(model.parameters()) + list(model.buffers())
    if _same_everywhere(_fingerprint(tensors)):
        return  # parameters and buffers already identical: checked
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, src=0)
    assert_identical(model)


def _fingerprint(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Sum modulo 2^64 of the tensors' bit patterns, read as int64 words (int32 words or
    bytes where the size does not divide): exact, so it does not depend on summation order
    or thread count, and nothing is copied (0.4 s for AlexNet's 61M parameters with the
    int32 words widened one by one; 0.01 s as int64 words)."""
    total = torch.zeros(1, dtype=torch.int64, device=tensors[0].device if tensors else "cpu")
    with torch.no_grad():
        for t in tensors:
            flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
            for width, dtype in ((8, torch.int64), (4, torch.int32), (1, torch.uint8)):
                if flat.numel() % width == 0 and flat.storage_offset() % width == 0:
                    total += flat.view(dtype).sum(dtype=torch.int64).to(total.device)
                    break
    return total


def checksum(model: nn.Module) -> torch.Tensor:
    """The parameters' fingerprint (``_fingerprint``)."""
    return _fingerprint(list(model.parameters()))


def _same_everywhere(c: torch.Tensor) -> bool:
    """Collective (two all_reduces): whether every rank passed the same value."""
    lo, hi = c.clone(), c.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return torch.equal(lo, hi)


def assert_identical(model: nn.Module) -> None:
    """Collective: raise on every rank if the ranks' parameters differ."""
    c = checksum(model)
    if not _same_everywhere(c):
        raise RuntimeError(f"model weights differ across ranks (this rank's checksum {c.item()})")


def rng_state(device: torch.device) -> dict:
    """This process's torch RNG states (CPU; and the device's on CUDA): what the next
    augmentation, DataLoader seed and dropout mask draw from. Local."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict | None, device: torch.device) -> None:
    """Restore ``rng_state``'s result (None: leave the RNG as it is). Local."""
    if state is None:
        return
    torch.set_rng_state(state["cpu"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def snapshot(model: nn.Module, opt, reducer, epoch: int, metrics: dict | None, device: torch.device) -> dict:
    """One rank's checkpoint: weights (its own buffers), optimiser, reducer state, this
    process's RNG state and the epoch's metrics. Local."""
    return {
        "epoch": epoch,
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "reducer": reducer.state_dict(),
        "rng": rng_state(device),
        "metrics": metrics,
    }


def restore(model: nn.Module, opt, reducer, state: dict, device: torch.device) -> None:
    """Load ``snapshot``'s result into one rank (the RNG too, when the file has it). Local."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    reducer.load_state_dict(_reducer_state(state))
    set_rng_state(state.get("rng"), device)


class Checkpoints:
    """A distributed job's checkpoint generations (``gtopk.train.checkpoint``): per epoch,
    every rank's file (model, optimiser, the reducer's ``state_dict()``: its error-feedback
    residual is per rank, the rank's RNG state, so a resumed job draws what an uninterrupted
    one would, bit-identical with ``train.loader_workers=0``, and the epoch's metrics:
    ``snapshot``), then rank 0's manifest. ``load`` returns the next epoch to run and leaves
    the restored epoch's metrics in ``metrics`` (so that a crash between saving an epoch and
    recording it loses no record). Rank 0 reads the manifests and tells the others; each rank
    checks and reads only its own file, so hosts need not share the folder except for rank
    0's manifest. Files of older formats (the residual under ``"residual"``; no RNG; the one
    file per rank of the layout before generations) load too."""

    def __init__(self, run: RunDir, rank: int, world: int, fingerprint: str | None = None, extends: str | None = None):
        self.store, self.rank, self.world, self.fingerprint = Store(run, world), rank, world, fingerprint
        self.extends = extends  # a job that trains a finished run longer: that run's fingerprint (rank 0's counts)
        self.metrics: dict | None = None
        run.checkpoints.mkdir(parents=True, exist_ok=True)

    def save(self, w, epoch: int, metrics: dict | None = None) -> None:
        """Collective (all_gather_object of the files' entries, after every rank wrote its
        file; a barrier after rank 0 wrote the manifest). Older generations are pruned after."""
        entry = self.store.write(epoch, self.rank, snapshot(w.model, w.opt, w.reducer, epoch, metrics, w.device))
        entries: list = [None] * self.world
        dist.all_gather_object(entries, entry)  # every rank's file is in place
        if self.rank == 0:
            self.store.commit(epoch, entries, self.fingerprint)
        dist.barrier()  # the generation is complete before anyone moves on (or prunes)
        self.store.complete = [*self.store.complete[-1:], epoch]
        self.store.link(epoch, self.rank)
        self.store.prune(set(self.store.complete), None if self.rank == 0 else self.rank)

    def load(self, w) -> int:
        """Collective. Resume from the newest generation complete and intact on every rank
        (0: none); generations that are not are removed. A generation of the finished run
        this job trains longer (rank 0's ``extends``) resumes as one of its own."""
        found = [(self.store.manifests(), self.extends) if self.rank == 0 else None]
        dist.broadcast_object_list(found, src=0)
        manifests, extends = found[0]
        check_settings(manifests, self.world, self.fingerprint, self.store.run, extends)  # the same verdict everywhere
        mine = ([self.store.matches(m, self.rank) for m in manifests], self.store.legacy_epoch(self.rank))
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, mine)
        valid = [all(flags[i] for flags, _ in everyone) for i in range(len(manifests))]
        chosen, keep = choose(manifests, valid)
        if chosen is None:
            chosen = legacy_manifest([e for _, e in everyone], self.store.run)
        if self.rank == 0:
            for line in passed_over(manifests, valid, chosen):
                print(f"warning: {line}", file=sys.stderr, flush=True)
        self.store.complete = sorted(keep)
        self.store.prune(keep, None if self.rank == 0 else self.rank, newer=True)
        if chosen is not None:
            state = self.store.read(chosen, self.rank, w.device)
            restore(w.model, w.opt, w.reducer, state, w.device)
            self.metrics = state.get("metrics")
            assert_identical(w.model)
        dist.barrier()  # pruned before anyone writes the next generation
        return 0 if chosen is None else chosen["epoch"] + 1


def _reducer_state(state: dict) -> dict:
    """The reducer's state of a checkpoint; older files kept the residual (or None, for
    reducers without one) under ``"residual"``."""
    if "reducer" in state:
        return state["reducer"]
    return {} if state.get("residual") is None else {"residual": state["residual"]}


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over ``model.state_dict()`` in order (each name, then the tensor's bytes):
    the final weights' fingerprint, to compare runs (parameters are equal on every rank,
    buffers such as BatchNorm statistics are this rank's). Local, not collective."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())  # its buffer: no copy
    return h.hexdigest()
