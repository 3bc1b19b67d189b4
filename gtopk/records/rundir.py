"""What a job leaves in its run directory, written so that a crash loses nothing written.

``RunDir(path)`` names every file (the one place these names are spelled); ``run_dirs``,
``finished`` and ``failed`` find jobs under a root.

* ``config.yaml``: the resolved config (its presence makes a folder a run directory).
* ``iters.rank<r>.jsonl``: one line per iteration and rank (timings, record), appended
  and flushed line by line; ``epochs.jsonl``: per-epoch metrics (rank 0), with the
  coverage so far (``gtopk.records.regime``). A crash can
  leave a half-written last line: appending first closes it off with a newline, and
  ``read_jsonl`` skips it (never fatal). Rows carry the job's ``attempt``.
* ``summary.json``: medians over all ranks' post-warm-up iterations, with ``env``
  (versions, device, CPU/GPU, git commit) and, for training, the final coverage and the
  test top-1 trend, and the config's ``fingerprint`` (built by ``gtopk.records.summary``);
  written atomically (temp file + rename), so its presence means the job finished.
* ``attempts.jsonl`` (one line per attempt), ``failed.json`` (the last attempt's error;
  never beside a ``summary.json``), ``.lock`` (flock of the process running the job):
  see ``gtopk.run.jobs``.
* ``checkpoint/epoch<k>/rank<r>.pt`` and ``manifest.json`` (written last: the generation is
  complete): every rank's training state of epoch k, the two newest complete generations
  kept; ``checkpoint/rank<r>.pt`` links to rank r's newest (``gtopk.train.checkpoint``).
* ``identity.json``: the settings the folder's work is done with, their fingerprint and the
  code version (``gtopk.records.identity``); ``superseded/<time>/``: an older result of other
  settings, moved aside by ``rerun=true`` (never read as a run directory).
* ``wandb/``: the wandb run's files; ``<job name>.log``: Hydra's log of the job.

An unreadable ``summary.json`` or ``config.yaml`` (a partial copy, a power cut, a hand edit)
never stops a reader: ``finished`` and ``summary_if_readable`` pass over it with a one-line
warning, and the job quarantines it and runs again (``gtopk.run.execute``).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gtopk.records.schema import SUMMARY as SUMMARY_SCHEMA
from gtopk.records.schema import problems, schema_of

CONFIG = "config.yaml"
SUMMARY = "summary.json"
EPOCHS = "epochs.jsonl"
ATTEMPTS = "attempts.jsonl"
FAILED = "failed.json"
LOCK = ".lock"
IDENTITY = "identity.json"
SUPERSEDED = "superseded"
CHECKPOINTS = "checkpoint"
WANDB = "wandb"
ITERS_GLOB = "iters.rank*.jsonl"


@dataclass(frozen=True)
class RunDir:
    """The files of one job's run directory (paths only: nothing is created or read)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        """The resolved config."""
        return self.path / CONFIG

    @property
    def summary(self) -> Path:
        """Written last, atomically: the job finished."""
        return self.path / SUMMARY

    @property
    def epochs(self) -> Path:
        """Per-epoch metrics (rank 0, training)."""
        return self.path / EPOCHS

    @property
    def attempts(self) -> Path:
        """One line per attempt of the job."""
        return self.path / ATTEMPTS

    @property
    def failed(self) -> Path:
        """The last attempt's error."""
        return self.path / FAILED

    @property
    def lock(self) -> Path:
        """Locked (flock) by the process running the job."""
        return self.path / LOCK

    @property
    def checkpoints(self) -> Path:
        """The folder of per-rank checkpoints."""
        return self.path / CHECKPOINTS

    @property
    def wandb(self) -> Path:
        """The wandb run's folder."""
        return self.path / WANDB

    def iters(self, rank: int) -> Path:
        return self.path / f"iters.rank{rank}.jsonl"

    def all_iters(self) -> list[Path]:
        """Every rank's iteration file, by name."""
        return sorted(self.path.glob(ITERS_GLOB))

    def checkpoint(self, rank: int, epoch: int | None = None) -> Path:
        """Rank ``rank``'s file of the generation of epoch ``epoch``; without ``epoch``,
        ``checkpoint/rank<r>.pt``: a symlink to its newest complete one (a regular file in
        run directories from before generations)."""
        return (self.checkpoints if epoch is None else self.generation(epoch)) / f"rank{rank}.pt"

    def generation(self, epoch: int) -> Path:
        """The folder of every rank's checkpoint of epoch ``epoch``."""
        return self.checkpoints / f"epoch{epoch}"

    def checkpoint_manifest(self, epoch: int) -> Path:
        """Written last: the generation of epoch ``epoch`` is complete."""
        return self.generation(epoch) / "manifest.json"

    def job_log(self, job_name: str) -> Path:
        """Hydra's log of the job (``hydra.job.name``, ``run`` for run.py)."""
        return self.path / f"{job_name}.log"

    @property
    def is_finished(self) -> bool:
        """``summary.json`` exists and is readable (a JSON object)."""
        return self.summary_if_readable() is not None

    @property
    def has_failed(self) -> bool:
        """The last attempt failed (and none finished since)."""
        return self.failed.exists() and not self.is_finished

    def read_summary(self) -> dict:
        """``summary.json``; ``CorruptRecord`` (one line) when it is not a JSON object."""
        return _read_json_object(self.summary, SUMMARY_SCHEMA)

    def summary_if_readable(self) -> dict | None:
        """``summary.json``, or None when there is none or it is unreadable (a one-line
        warning, once per file and process)."""
        if not self.summary.exists():
            return None
        try:
            return self.read_summary()
        except CorruptRecord as e:
            warn_once(str(e))
            return None

    def read_config(self) -> dict:
        """The resolved config as a dict; ``CorruptRecord`` (one line) when unreadable."""
        from omegaconf import OmegaConf

        try:
            cfg = OmegaConf.to_container(OmegaConf.load(self.config), resolve=True)
        except Exception as e:  # noqa: BLE001 - YAML, interpolation or I/O: unreadable
            raise CorruptRecord(f"{self.config} is unreadable ({_first_line(e)})") from None
        if not isinstance(cfg, dict):
            raise CorruptRecord(f"{self.config} is unreadable (not a mapping)")
        return cfg


class CorruptRecord(ValueError):
    """A record of a run directory cannot be read; the message is one line naming it."""


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """``warning: <message>`` on stderr, once per message and process."""
    if message not in _warned:
        _warned.add(message)
        print(f"warning: {message}; skipped", file=sys.stderr, flush=True)


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def _read_json_object(path: Path, schema: dict[str, str] | None = None) -> dict:
    try:
        obj = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, not JSON
        raise CorruptRecord(f"{path} is unreadable ({_first_line(e)})") from None
    if not isinstance(obj, dict):
        raise CorruptRecord(f"{path} is unreadable (not a JSON object)")
    wrong = problems(obj, schema) if schema else []
    if wrong:
        raise CorruptRecord(f"{path} is unreadable (wrong types: {', '.join(wrong[:3])})")
    return obj


def run_dirs(roots: Iterable[str | Path]) -> list[RunDir]:
    """Run directories (holding ``config.yaml``) under ``roots``, Hydra's ``.hydra/``,
    wandb's folders (which hold a ``config.yaml`` of their own) and results moved aside
    (``superseded/``) left out."""
    found = set()
    for root in roots:
        for cfg in Path(root).rglob(CONFIG):
            below = cfg.relative_to(root).parts[:-1]
            if ".hydra" not in below and WANDB not in below and SUPERSEDED not in below:
                found.add(cfg.parent)
    out = []
    for d in sorted(found):
        try:
            RunDir(d).read_config()
        except CorruptRecord as e:  # an unreadable config: passed over, with a warning
            warn_once(str(e))
            continue
        out.append(RunDir(d))
    return out


def finished(roots: Iterable[str | Path]) -> list[RunDir]:
    """Run directories under ``roots`` whose job finished (readable ``summary.json`` and
    ``config.yaml``); an unreadable one is passed over with a one-line warning."""
    return [d for d in run_dirs(roots) if d.is_finished]


def failed(roots: Iterable[str | Path]) -> list[RunDir]:
    """Run directories under ``roots`` whose last attempt failed (``failed.json``)."""
    return [d for d in run_dirs(roots) if d.has_failed]


def write_json_atomic(path: Path, obj: Any) -> None:
    """``obj`` as ``path``, whole or not at all (temp file, fsync, rename); a failed write
    (a full disk) leaves no temp file behind."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class JsonLines:
    """Append-only JSON-lines file; every line is flushed as it is written. A half-written
    last line left by a crash is closed off (newline) before the first new line."""

    def __init__(self, path: Path):
        self.path = path
        self.f = open(path, "a", buffering=1)
        if path.stat().st_size and not _ends_with_newline(path):
            self.f.write("\n")

    def write(self, row: dict) -> None:
        self.f.write(json.dumps(row, default=float) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def iter_jsonl(path: Path) -> Iterator[dict]:
    """The usable rows of a JSON-lines record file, one by one: every line that is UTF-8,
    JSON, an object and of the file's schema (``gtopk.records.schema``). What a crash leaves
    (a half-written line: the start of an object) is passed over silently; any other
    unusable line with one warning naming the file and how many (once per file and
    process). Nothing when there is no file; ``<name>.gz`` where only that is (an archive's).
    A gzip stream cut short ends the rows there, with the warning."""
    if not path.exists():
        packed = path.with_name(path.name + ".gz")  # an archived job's rows (gtopk.records.archive)
        if not packed.exists():
            return
        path, opener = packed, gzip.open
    else:
        opener = open
    schema = schema_of(path.name.removesuffix(".gz"))
    bad, why = 0, ""
    with opener(path, "rb") as f:
        try:
            for raw in f:
                row, problem = _row(raw, schema)
                if problem:
                    bad, why = bad + 1, why or problem
                if row is not None:
                    yield row
        except (OSError, EOFError) as e:  # a damaged gzip stream: the rows before the damage
            bad, why = bad + 1, why or f"damaged: {_first_line(e)}"
    if bad:
        warn_once(f"{path}: {bad} unusable line(s) ({why})")


def _row(raw: bytes, schema: dict[str, str] | None) -> tuple[dict | None, str | None]:
    """A line's row, or None and what is wrong with it (None also for a crash's half-written
    row, which is no problem)."""
    try:
        row = json.loads(raw)
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError:
        half = not raw.strip() or raw.lstrip().startswith(b"{")  # blank, or the start of a row
        return None, None if half else "not JSON"
    if not isinstance(row, dict):
        return None, "not an object"
    wrong = problems(row, schema) if schema else []
    return (None, f"wrong types: {wrong[0]}") if wrong else (row, None)


def read_jsonl(path: Path) -> list[dict]:
    """``iter_jsonl``'s rows as a list."""
    return list(iter_jsonl(path))
