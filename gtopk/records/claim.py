"""The run folder is the project's, and only the project's.

A job writes only into a folder that is new, empty, or one a job of this project made: the
first thing a job writes there is the marker ``.gtopk-run`` (``claim``). A folder made before
the marker existed counts as the project's when it holds a job's own records
(``identity.json`` or ``attempts.jsonl``), so that runs in progress resume. Any other
existing folder is refused in one line, and so are ``/``, system folders, home folders and
the project's own checkout, whatever they hold (``folder_problem``, checked on the command
line before Hydra creates anything: ``gtopk.run.overrides``). ``rerun=true`` moves only the
entries a job writes (``own_entries``: the names of ``gtopk.records.rundir``, one list for the
writer and the mover), never anything else found in the folder.

``short_folder`` keeps a folder name within the file system's 255 bytes: a longer one (the
overrides of a job, ``hydra.job.override_dirname``) is cut and ends in a hash of the whole,
which the resolved config and ``.hydra/overrides.yaml`` still hold in full.

Local file work only; nothing is collective.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path

from gtopk.records.rundir import (
    ATTEMPTS,
    CHECKPOINTS,
    CONFIG,
    EPOCHS,
    FAILED,
    IDENTITY,
    ITERS_GLOB,
    LOCK,
    SUMMARY,
    SUPERSEDED,
    WANDB,
)

MARKER = ".gtopk-run"
#: records that make a folder from before the marker the project's
LEGACY = (IDENTITY, ATTEMPTS)
#: what Hydra writes into a job's folder before the job starts
HYDRA = (".hydra", "*.log")
#: what a job writes (names and patterns): what ``rerun=true`` moves aside
JOB_OWN = (
    CONFIG,
    SUMMARY,
    EPOCHS,
    ATTEMPTS,
    FAILED,
    IDENTITY,
    CHECKPOINTS,
    WANDB,
    ITERS_GLOB,
    "*.corrupt-*",  # records quarantined by a reader
    f".{FAILED}.tmp*",  # atomic writes a kill interrupted
    f".{SUMMARY}.tmp*",
    f".{IDENTITY}.tmp*",
)
#: kept where they are by ``rerun=true``: the lock, the marker, Hydra's files, older results
KEPT = (LOCK, MARKER, SUPERSEDED, *HYDRA)
NAME_MAX = 255  # bytes in one folder name (Linux, macOS)
SYSTEM = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc", "/run")
SYSTEM += ("/sbin", "/srv", "/sys", "/usr", "/var", "/snap", "/home", "/root", "/media", "/mnt")


class ForeignFolder(ValueError):
    """The run folder holds things that are not a job's of this project (one-line message)."""


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def own_entries(run_dir: Path) -> list[Path]:
    """The entries of ``run_dir`` that a job wrote (``JOB_OWN``), by name."""
    return sorted(p for p in run_dir.iterdir() if _matches(p.name, JOB_OWN) and not _matches(p.name, KEPT))


def foreign_entries(run_dir: Path) -> list[str]:
    """The names in ``run_dir`` that neither a job nor Hydra writes there."""
    return sorted(p.name for p in run_dir.iterdir() if not _matches(p.name, JOB_OWN + KEPT))


def is_projects(folder: Path) -> bool:
    """Whether ``folder`` is a run folder a job of this project made (marker, or records
    from before it)."""
    return (folder / MARKER).exists() or any((folder / name).exists() for name in LEGACY)


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def claim(run_dir: Path) -> None:
    """Make ``run_dir`` the job's (write the marker) unless a job of this project made it
    already; ``ForeignFolder`` when it holds anything else and is not the project's."""
    if is_projects(run_dir):
        if not (run_dir / MARKER).exists():
            (run_dir / MARKER).touch()
        return
    foreign = foreign_entries(run_dir)
    if foreign:
        raise ForeignFolder(foreign_message(run_dir, foreign))
    (run_dir / MARKER).touch()


def foreign_message(folder: Path, foreign: list[str]) -> str:
    return (
        f"{folder} holds files that no job of this project wrote ({_shown(foreign)}): a job writes only into a new "
        "or empty folder, or one it made; give a fresh hydra.run.dir= (or hydra.sweep.dir= with -m). rerun=true "
        "moves only a job's own files and does not take a folder over"
    )


def _checkout() -> Path:
    return Path(__file__).resolve().parents[2]


def forbidden(folder: Path, checkout: Path | None = None) -> str | None:
    """Why ``folder`` (absolute, resolved) may never be a run folder: ``/``, a system or
    home folder, the project's checkout or a folder holding it; None otherwise."""
    checkout = checkout or _checkout()
    home = Path(os.path.expanduser("~")).resolve()
    if folder == Path("/"):
        return "is the file system's root"
    if folder == home or str(folder) in SYSTEM or folder.parent == Path("/home"):
        return "is a home folder" if folder == home or folder.parent == Path("/home") else "is a system folder"
    open_below = ("/home", "/root", "/mnt", "/media", "/srv", "/opt", "/var/tmp")
    if any(folder.is_relative_to(s) for s in SYSTEM) and not any(folder.is_relative_to(s) for s in open_below):
        return "is inside a system folder"
    if folder == checkout or checkout.is_relative_to(folder):
        return "is this project's checkout" if folder == checkout else "holds this project's checkout"
    return None


def folder_problem(setting: str, value: str, sweep: bool = False) -> str | None:
    """One line on what is wrong with ``value`` as ``setting`` (``hydra.run.dir``, or with
    ``sweep`` ``hydra.sweep.dir``: a folder of run folders), relative to the working
    directory; None when a job may write there."""
    folder = Path(os.path.abspath(os.path.expanduser(value)))
    try:
        folder = folder.resolve()
    except OSError:
        pass
    why = forbidden(folder)
    if why:
        return f"{setting}={value} {why}: runs never write there; give a folder of their own, e.g. {setting}=runs/mine"
    long = next((p for p in folder.parts if len(p.encode()) > NAME_MAX), None)
    if long is not None:
        return f"{setting}={value}: the folder name {long[:40]}... is over {NAME_MAX} bytes; give a shorter one"
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{setting}={value}: {existing} is a file, not a folder; give a folder's path"
    if not os.access(existing, os.W_OK | os.X_OK) or _read_only(existing):
        return (
            f"{setting}={value}: {existing} is not writable here; give a folder you can write, e.g. {setting}=runs/mine"
        )
    if existing == folder:
        foreign = foreign_entries(folder)
        if sweep:  # a folder of run folders: its own sweep record, run folders, analyses
            foreign = [n for n in foreign if n != "multirun.yaml" and not (folder / n).is_dir()]
        if foreign and not is_projects(folder):
            return foreign_message(folder, foreign)
    return None


def _read_only(folder: Path) -> bool:
    """Whether ``folder``'s file system is mounted read-only (root passes ``os.access``)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def short_folder(name: str) -> str:
    """``name`` as one folder name of at most ``NAME_MAX`` bytes: unchanged when it fits,
    else its first bytes and a hash of the whole (the same name, the same folder)."""
    raw = str(name).encode()
    if len(raw) <= NAME_MAX:
        return str(name)
    digest = hashlib.sha256(raw).hexdigest()[:16]
    head = raw[: NAME_MAX - len(digest) - 1].decode(errors="ignore")
    return f"{head}-{digest}"
