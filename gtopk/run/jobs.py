"""A job's life in its run directory and in a sweep.

* One process at a time per run directory: ``job_lock`` takes an exclusive ``flock`` on
  ``<run_dir>/.lock`` (released by the kernel when the process dies, so never stale); a
  second sweep reaching the same job gets ``JobBusy`` and goes on with its next job. On a
  filesystem without ``flock`` the job is refused the same way (``LockUnavailable``, a
  ``JobBusy`` whose line names the fix), not with an OSError traceback.
* One torchrun world at a time per run directory: ``torchrun_lock`` takes the same lock on
  rank 0, and ``agree_on_lock`` (collective) hands rank 0's refusal to every rank.
* ``start_attempt`` appends to ``attempts.jsonl`` and returns the attempt number that the
  iteration rows carry; it removes a previous attempt's ``failed.json``.
* ``job_failed``: a failed job gets ``failed.json`` (one-line error, every rank's
  traceback) and the full error in the job's log (Hydra's ``<run_dir>/<job name>.log``),
  never a ``summary.json``, so a re-run retries it. Single run: the process exits
  non-zero. Multirun (basic launcher): the sweep goes on with the next job, and the
  ``FailedJobs`` callback (``hydra.callbacks`` in ``conf/config.yaml``) lists the failed
  jobs at the end and exits with status 1. Under other launchers (SLURM) the job itself
  exits non-zero; ``gtopk.run.slurm.launcher`` hands the failed ones to ``FailedJobs``
  (``ran_elsewhere``), which lists them the same way.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from gtopk.records.rundir import ATTEMPTS, FAILED, LOCK, read_jsonl, write_json_atomic
from gtopk.records.summary import git_commit
from gtopk.run import dispatch

log = logging.getLogger(__name__.split(".")[0])  # the package's logger (gtopk)
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
EXIT_FAILED, EXIT_BAD_INPUT = 1, 2


class JobBusy(RuntimeError):
    """Another live process is running this job (same run directory). Bad input, one line:
    ``gtopk.run.execute`` exits 2 (a sweep goes on) and writes nothing into the run directory."""


class LockUnavailable(JobBusy):
    """The run directory's filesystem has no ``flock``, so whether another process runs the
    job cannot be known: refused as ``JobBusy`` is; the message names the fix (where runs go)."""


#: what ``flock`` fails with where the filesystem does not lock (Lustre without ``-o flock``,
#: NFS without lockd, some FUSE filesystems)
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS)


@contextmanager
def job_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the block (local, not collective); ``JobBusy`` if another
    process holds it, ``LockUnavailable`` if its filesystem cannot lock."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another open file holds it
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise JobBusy(
            f"{run_dir} is being run by another process (pid {holder}); wait for it to finish "
            "(then re-run: finished jobs are skipped), or pass another name="
        ) from None
    except OSError as e:
        os.close(fd)
        if e.errno not in NO_FLOCK:
            raise
        raise LockUnavailable(
            f"{run_dir}: its filesystem cannot lock files (flock: {e.strerror}), and a run folder is locked "
            "so that two processes never run one job; put runs on a local filesystem "
            "(hydra.run.dir=/local/path, or hydra.sweep.dir=/local/path with -m), or mount it with locking "
            "(Lustre: -o flock; NFS: with lockd)"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def torchrun_lock(run_dir: Path, rank: int | None = None) -> Iterator[JobBusy | None]:
    """Local, not collective: on rank 0 (``rank``, default the ``RANK`` variable torchrun
    sets), hold ``job_lock(run_dir)`` for the block; other ranks take nothing. Yields rank
    0's refusal (the ``JobBusy``, or ``LockUnavailable``, it got: not raised, so that rank 0
    still joins the group and tells the others) or None. Rank 0 writes into ``run_dir`` only
    when it is None; every rank passes it to ``agree_on_lock`` right after joining the group."""
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    held, refusal = ExitStack(), None
    if rank == 0:
        try:
            held.enter_context(job_lock(run_dir))
        except JobBusy as e:  # LockUnavailable too
            refusal = e
    with held:
        yield refusal


def agree_on_lock(refusal: JobBusy | None) -> None:
    """Collective over the default process group (every rank, right after joining it):
    rank 0's ``refusal`` from ``torchrun_lock`` goes to every rank, and every rank raises
    it (one line, exit 2 through ``gtopk.run.execute``); returns when rank 0 holds the lock."""
    verdict = [refusal]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise verdict[0]


def start_attempt(run_dir: Path, note: dict | None = None) -> int:
    """Record a new attempt of the job (call while holding its lock); returns its number.
    ``note``: more fields of its row (a run trained longer: ``extended``)."""
    attempt = len(read_jsonl(run_dir / ATTEMPTS)) + 1
    with open(run_dir / ATTEMPTS, "a") as f:
        row = {"attempt": attempt, "pid": os.getpid(), "started": time.time(), "commit": git_commit(), **(note or {})}
        f.write(json.dumps(row) + "\n")
    (run_dir / FAILED).unlink(missing_ok=True)
    return attempt


@dataclass(frozen=True)
class Failure:
    """One job of this sweep that did not finish."""

    run_dir: str
    error: str  # one line
    log: str | None


_failed: list[Failure] = []  # this process's failed jobs in the current sweep
_jobs = 0  # jobs started in the current sweep


def job_started() -> None:
    global _jobs
    _jobs += 1


def in_basic_sweep() -> bool:
    """A multirun whose jobs run one after another in this process."""
    hc = HydraConfig.get()
    return hc.mode == RunMode.MULTIRUN and hc.launcher._target_ == BASIC_LAUNCHER


def job_log() -> Path | None:
    """Hydra's log file of the current job (None when Hydra does not configure one)."""
    try:
        hc = HydraConfig.get()
        return Path(hc.runtime.output_dir) / f"{hc.job.name}.log"
    except ValueError:
        return None


def job_failed(
    run_dir: Path, one_line: str, code: int, record: dict[str, Any] | None = None, full_text: str | None = None
) -> None:
    """Report a job that did not finish: ``one_line`` on stderr, ``full_text`` (every
    rank's traceback) in the job log, ``record`` into ``failed.json`` (None: write nothing,
    e.g. the run directory is another process's). In a basic-launcher sweep, return (the
    sweep goes on); otherwise exit with ``code``."""
    if full_text is not None:
        log.error("job failed: %s\n%s", one_line, full_text)
    unrecorded = ""
    if record is not None and run_dir.is_dir():
        try:
            write_json_atomic(run_dir / FAILED, {"error": one_line, "time": time.time(), **record})
        except OSError as e:  # a full or read-only disk: the failure is still said, on stderr
            unrecorded = f" (not recorded in {FAILED}: {e.strerror or e})"
    print(f"error: {one_line}{unrecorded}", file=sys.stderr, flush=True)
    if not in_basic_sweep():
        raise SystemExit(code)
    path = job_log() if full_text is not None else None
    _failed.append(Failure(str(run_dir), one_line, str(path) if path else None))


def ran_elsewhere(count: int, failures: list[Failure]) -> None:
    """``count`` jobs of this sweep ran in other processes (a launcher's, e.g. SLURM jobs);
    ``failures``: those that did not finish, for ``FailedJobs`` to list."""
    global _jobs
    _jobs += count
    _failed.extend(failures)


class FailedJobs(Callback):
    """Hydra callback: at the end of a sweep, close the sweep's worker group
    (``gtopk.run.dispatch``), list the jobs that did not finish and exit 1."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        global _jobs
        _failed.clear()
        _jobs = 0

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        dispatch.close()
        if not _failed:
            return
        lines = [
            f"{len(_failed)} of {_jobs} job(s) did not finish (re-run the same command to retry "
            "them; finished jobs are skipped):"
        ]
        for f in _failed:
            lines.append(f"  {f.run_dir}: {f.error}" + (f" [log: {f.log}]" if f.log else ""))
        print("\n".join(lines), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_FAILED)  # not an Exception: Hydra's callback runner lets it through
