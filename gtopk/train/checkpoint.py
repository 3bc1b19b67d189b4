"""Checkpoint generations on disk: what a kill at any moment leaves resumable.

A generation is one epoch's checkpoint of every rank, in its own folder:
``checkpoint/epoch<k>/rank<r>.pt`` (``RunDir.checkpoint(r, k)``), then
``checkpoint/epoch<k>/manifest.json`` (``RunDir.checkpoint_manifest(k)``), written LAST:
its presence marks the generation complete. Each rank file is written to a temporary
name, fsynced, renamed into place and its folder fsynced; the manifest (format, epoch,
world size, each rank's file name, size and sha256, and the job's config ``fingerprint``)
the same way, after every rank file. Resume takes the newest generation whose manifest
parses and whose files all match it (size and sha256); a folder without a manifest (a kill
mid-write) or with a file that does not match (truncated, corrupted) is passed over and
removed. The two newest complete generations are kept: older ones are pruned only after
the new manifest is in place, so a kill at any moment costs at most the epoch in progress.

``checkpoint/rank<r>.pt`` is a relative symlink to rank r's file of the newest complete
generation (for people and tools; resume never follows it). A regular file there is the
layout from before generations (one file per rank, rewritten each epoch): it resumes when
every rank's file holds the same epoch (``legacy_epoch``) and is replaced by the symlink at
the first save. Files of that layout that hold different epochs cannot be combined: the
job stops, naming them (no generation to fall back to existed then).

Everything is read with ``torch.load(..., weights_only=True)``. Nothing here is collective:
``gtopk.train.state.Checkpoints`` coordinates the ranks of a distributed job, the simulated
cluster (``gtopk.simulated.ranks``) does all P ranks itself. ``KILL_HOOK`` (tests only) makes
the process SIGKILL itself right after writing one rank's file of one epoch.

Not ``torch.distributed.checkpoint``: it too writes its metadata last, but it takes a key
saved by several ranks for one replicated tensor and keeps one copy, where every rank here
holds its own BN statistics, residual, RNG and PowerSGD state under the same keys; it
assumes SPMD ranks, one process each, and loads into tensors allocated beforehand, where
the simulated cluster is P ranks in one process and a reducer state's shape is known only
from the file; and it reads its metadata and non-tensor values with pickle, not weights-only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from gtopk.records.rundir import RunDir

FORMAT = 1
#: tests: ``"<epoch>:<rank>"`` SIGKILLs the process after it wrote that rank's file of that epoch
KILL_HOOK = "GTOPK_TEST_KILL_AFTER_CHECKPOINT"
_PREFIX = "epoch"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _kill_hook(epoch: int, rank: int) -> None:
    if os.environ.get(KILL_HOOK) == f"{epoch}:{rank}":
        os.kill(os.getpid(), signal.SIGKILL)


def load_file(path: Path, device: torch.device | str = "cpu") -> dict:
    """One rank's saved state (``weights_only``: tensors, containers and numbers only)."""
    return torch.load(path, map_location=device, weights_only=True)


class Store:
    """The checkpoint folder of run ``run`` for ``world`` ranks. Local: no method is collective."""

    def __init__(self, run: RunDir, world: int):
        self.run, self.world = run, world
        self.complete: list[int] = []  # epochs of the complete generations kept, oldest first

    # -- writing ----------------------------------------------------------------------
    def write(self, epoch: int, rank: int, state: dict) -> dict:
        """Rank ``rank``'s file of generation ``epoch`` (durably: temp file, fsync, rename,
        fsync of the folder); returns its manifest entry (rank, file, bytes, sha256)."""
        folder, path = self.run.generation(epoch), self.run.checkpoint(rank, epoch)
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            _fsync_dir(folder.parent)
        tmp = folder / f".{path.name}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        digest, size = _sha256(tmp)
        os.replace(tmp, path)
        _fsync_dir(folder)
        _kill_hook(epoch, rank)
        return {"rank": rank, "file": path.name, "bytes": size, "sha256": digest}

    def commit(self, epoch: int, entries: list[dict], fingerprint: str | None) -> dict:
        """Write generation ``epoch``'s manifest (after every rank's file), atomically and
        durably: from now on the generation is complete. Returns the manifest."""
        if sorted(e["rank"] for e in entries) != list(range(self.world)):
            raise ValueError(f"a manifest needs one entry per rank 0..{self.world - 1}, got {entries}")
        manifest = {
            "format": FORMAT,
            "epoch": epoch,
            "world": self.world,
            "fingerprint": fingerprint,
            "files": sorted(entries, key=lambda e: e["rank"]),
        }
        path = self.run.checkpoint_manifest(epoch)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return manifest

    def link(self, epoch: int, rank: int) -> None:
        """Point ``checkpoint/rank<r>.pt`` at rank ``rank``'s file of generation ``epoch``
        (atomically; it replaces a file of the old layout)."""
        top = self.run.checkpoint(rank)
        tmp = top.with_name(f".{top.name}.link{os.getpid()}")
        tmp.unlink(missing_ok=True)
        os.symlink(self.run.checkpoint(rank, epoch).relative_to(top.parent), tmp)
        os.replace(tmp, top)

    def prune(self, keep: set[int], rank: int | None = None, newer: bool = False) -> None:
        """Remove the generations not in ``keep`` that are older than its newest (with
        ``newer``, at resume: all of them, and stale temporary files): whole folders
        (``rank`` None: rank 0, or the one process of the simulated cluster), else only rank
        ``rank``'s own files in them (a distributed rank whose host may not share the folder)."""
        top = max(keep, default=-1)
        for epoch in self.epochs():
            if epoch in keep or (epoch > top and not newer):
                continue
            folder = self.run.generation(epoch)
            if rank is None:  # the manifest first: a kill midway leaves an incomplete generation
                self.run.checkpoint_manifest(epoch).unlink(missing_ok=True)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            for p in folder.glob(f"*{self.run.checkpoint(rank, epoch).name}*"):  # its file and temp files
                p.unlink(missing_ok=True)
            try:
                folder.rmdir()  # emptied: a host of its own (else rank 0 removes it)
            except OSError:
                pass
        if rank is None and newer and self.run.checkpoints.is_dir():  # at resume (no rank links now): temp
            # links a kill left, and the old layout's temp files
            for p in [*self.run.checkpoints.glob(".rank*.pt.link*"), *self.run.checkpoints.glob("rank*.tmp")]:
                p.unlink(missing_ok=True)

    def save_all(self, epoch: int, states: Iterable[dict], fingerprint: str | None) -> None:
        """Every rank's file of generation ``epoch`` (``states`` in rank order), then the
        manifest, the links, and pruning: one process for all ranks (the simulated cluster)."""
        entries = [self.write(epoch, rank, state) for rank, state in enumerate(states)]
        self.commit(epoch, entries, fingerprint)
        self.complete = [*self.complete[-1:], epoch]
        for rank in range(self.world):
            self.link(epoch, rank)
        self.prune(set(self.complete))

    def load_all(
        self, fingerprint: str | None, device: torch.device | str = "cpu", extends: str | None = None
    ) -> tuple[dict | None, list[dict]]:
        """One process for all ranks: the newest generation whose files all match its
        manifest (else the old layout's, else None) and every rank's state of it; the
        generations not kept are removed (incomplete, not matching, older than two).
        ``extends``: a fingerprint accepted besides ``fingerprint`` (``check_settings``)."""
        manifests = self.manifests()
        check_settings(manifests, self.world, fingerprint, self.run, extends)
        valid = [all(self.matches(m, r) for r in range(self.world)) for m in manifests]
        chosen, keep = choose(manifests, valid)
        if chosen is None:
            chosen = legacy_manifest([self.legacy_epoch(r) for r in range(self.world)], self.run)
        lines = passed_over(manifests, valid, chosen)
        listed = {m["epoch"] for m in manifests}
        for epoch in self.epochs():  # a manifest present but unreadable: passed over, said
            if epoch not in listed and self.run.checkpoint_manifest(epoch).exists():
                if chosen is None or epoch > chosen["epoch"]:
                    lines.append(f"the checkpoint of epoch {epoch} has an unreadable manifest: passed over")
        if chosen is None and (manifests or lines):
            lines.append("no checkpoint generation is readable: training starts again from epoch 0")
        for line in lines:
            print(f"warning: {line}", file=sys.stderr, flush=True)
        self.complete = sorted(keep)
        self.prune(keep, newer=True)
        return chosen, [] if chosen is None else [self.read(chosen, r, device) for r in range(self.world)]

    # -- reading ----------------------------------------------------------------------
    def epochs(self) -> list[int]:
        """The epochs of the generation folders present (complete or not), newest first."""
        found = []
        for p in self.run.checkpoints.glob(f"{_PREFIX}*") if self.run.checkpoints.is_dir() else ():
            tail = p.name[len(_PREFIX) :]
            if p.is_dir() and tail.isdigit():
                found.append(int(tail))
        return sorted(found, reverse=True)

    def manifest(self, epoch: int) -> dict | None:
        """Generation ``epoch``'s manifest when it is present and well-formed, else None."""
        try:
            m = json.loads(self.run.checkpoint_manifest(epoch).read_text())
            files = m["files"]
            ok = m["format"] == FORMAT and m["epoch"] == epoch and isinstance(m["world"], int)
            ok = ok and [e["rank"] for e in files] == list(range(m["world"]))
            ok = ok and all(isinstance(e["bytes"], int) and isinstance(e["sha256"], str) for e in files)
            ok = ok and all(isinstance(e["file"], str) and "/" not in e["file"] for e in files)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return m if ok else None

    def manifests(self) -> list[dict]:
        """The well-formed manifests, newest first (their files not yet checked)."""
        return [m for m in (self.manifest(e) for e in self.epochs()) if m is not None]

    def path(self, manifest: dict, rank: int) -> Path:
        return self.run.generation(manifest["epoch"]) / manifest["files"][rank]["file"]

    def matches(self, manifest: dict, rank: int, verify: bool = True) -> bool:
        """Whether rank ``rank``'s file of the generation is the one its manifest lists
        (size, then, with ``verify``, sha256: reads the file)."""
        entry, path = manifest["files"][rank], self.path(manifest, rank)
        try:
            if path.stat().st_size != entry["bytes"]:
                return False
            return not verify or _sha256(path)[0] == entry["sha256"]
        except OSError:
            return False

    def read(self, manifest: dict, rank: int, device: torch.device | str = "cpu") -> dict:
        """Rank ``rank``'s state of the generation (``weights_only``)."""
        if manifest.get("legacy"):
            return load_file(self.run.checkpoint(rank), device)
        return load_file(self.path(manifest, rank), device)

    def legacy_epoch(self, rank: int) -> int:
        """The epoch of rank ``rank``'s file of the old layout (a regular file
        ``checkpoint/rank<r>.pt``, not this layout's symlink); -1 if there is none."""
        path = self.run.checkpoint(rank)
        if path.is_symlink() or not path.is_file():
            return -1
        try:
            return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["epoch"])
        except Exception as e:  # noqa: BLE001 - unreadable: say which file, and why
            raise RuntimeError(f"{path} (a checkpoint from before generations) cannot be read: {e}") from None


def legacy_manifest(epochs: list[int], run: RunDir) -> dict | None:
    """The generation the old layout's files make (``epochs``: each rank's, -1 for none):
    every rank's file of one epoch, or None when a rank has none (its first save never
    completed: the job starts afresh, as it did then); raises when they hold different epochs."""
    if min(epochs, default=-1) < 0:
        return None
    if len(set(epochs)) != 1:
        raise RuntimeError(
            f"the checkpoint files in {run.checkpoints} (written before checkpoint generations) hold "
            f"epochs {epochs} by rank: they cannot be combined; move them aside to start over"
        )
    return {"format": 0, "epoch": epochs[0], "world": len(epochs), "fingerprint": None, "legacy": True, "files": []}


def check_settings(
    manifests: list[dict], world: int, fingerprint: str | None, run: RunDir, extends: str | None = None
) -> None:
    """Raise if a generation was written by other settings: another world size, or a
    fingerprint other than ``fingerprint`` (when both are known) or ``extends`` (the
    fingerprint of the finished run that this job trains longer: ``gtopk.records.extension``)."""
    for m in manifests:
        where = run.generation(m["epoch"])
        if m["world"] != world:
            raise RuntimeError(f"{where} holds a checkpoint of {m['world']} ranks; this job has {world}")
        if m["fingerprint"] is not None and fingerprint is not None and m["fingerprint"] not in (fingerprint, extends):
            raise RuntimeError(
                f"{where} holds a checkpoint of other settings (config fingerprint {m['fingerprint']}); "
                f"this job's is {fingerprint}"
            )


def choose(manifests: list[dict], valid: list[bool]) -> tuple[dict | None, set[int]]:
    """The newest generation whose files are valid on every rank (``valid[i]`` for
    ``manifests[i]``) and the epochs to keep: it and the next valid older one."""
    good = [m for m, ok in zip(manifests, valid) if ok]
    return (good[0] if good else None), {m["epoch"] for m in good[:2]}


def passed_over(manifests: list[dict], valid: list[bool], chosen: dict | None) -> list[str]:
    """What resume says about the complete generations newer than ``chosen`` that it
    passed over (a file that does not match its manifest)."""
    newer = [m for m, ok in zip(manifests, valid) if not ok and (chosen is None or m["epoch"] > chosen["epoch"])]
    return [
        f"the checkpoint of epoch {m['epoch']} has a file that does not match its manifest: passed over" for m in newer
    ]


def saved_generation(run_dir: Path, verify: bool = True) -> dict | None:
    """Local, read-only. The newest complete generation's manifest (epoch, world,
    fingerprint, files) under ``run_dir``: its manifest well-formed and every rank file
    matching it (``verify``: reads them to check their sha256; else their sizes only, which
    is what a job needs to learn the fingerprint: every generation of a folder has one).
    Else the old layout's files, when every rank's holds the same epoch (``legacy``: True,
    ``fingerprint`` None); else None."""
    run = RunDir(run_dir)
    store = Store(run, 0)
    for m in store.manifests():
        if all(store.matches(m, r, verify) for r in range(m["world"])):
            return m
    try:  # the old layout: as many files as the job's ranks (config.yaml), else as are there
        world = int(run.read_config()["nodes"])
    except Exception:  # noqa: BLE001 - no readable config
        world = 0
        while run.checkpoint(world).is_file():
            world += 1
    try:
        return legacy_manifest([store.legacy_epoch(r) for r in range(world)], run)
    except RuntimeError:  # unreadable, or of different epochs: the workers stop, saying why
        return None
