"""A job's identity: the fingerprint of its resolved config, and what a re-run does with it.

A run directory's name comes from the command-line overrides, so the same folder can be
reached with other settings (an edited experiment file, a new default after ``git pull``).
The job therefore binds what it leaves to the settings that made it:

* ``identity(cfg)``: the composed config, resolved, without the settings that cannot change
  a result (``NEUTRAL``: names, logging, wandb, timeouts, the rendezvous port, ``rerun``,
  fault injection other than ``nan``); ``fingerprint`` is its sha256.
* ``identity.json`` in the run directory (written when an attempt starts fresh) holds the
  identity, its fingerprint and the code version; ``summary.json`` and every checkpoint
  generation's manifest carry the fingerprint (``summary_fields``).
* ``verdict(run_dir, ident)`` (local, read-only): whether the folder is finished with these
  settings (skip), holds work of other settings (refuse, naming the first settings that
  differ and ``rerun=true``), or is free to run or resume.
* a finished training run of the same settings but fewer ``train.epochs`` is trained longer
  where that is exact (``gtopk.records.extension``; ``identity.json`` then also records,
  under ``extends``, the identity it continues).
* ``move_aside(run_dir)``: ``rerun=true`` moves the old result into ``superseded/<time>/``
  (never deletes it). ``quarantine(path)``: an unreadable record is renamed aside.

The code version is recorded (``code``), not part of the identity: a re-run after a commit
that changed no setting skips finished jobs and resumes checkpoints (the commit of each
attempt is in ``attempts.jsonl``), so a documentation commit does not cost a sweep.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gtopk.records.claim import own_entries
from gtopk.records.rundir import CONFIG, IDENTITY, SUPERSEDED, CorruptRecord, RunDir, write_json_atomic
from gtopk.records.summary import git_commit

#: settings that cannot change a job's result (dotted keys; a prefix covers its subtree)
NEUTRAL = (
    "name",
    "logger",
    "timeout_s",
    "collective_timeout_s",
    "master_port",
    "rerun",
    "attempt",
    "fingerprint",
    "extends",  # the workers' note of the run a job trains longer (gtopk.records.extension)
    "fault",  # fault.kind=nan changes the result: kept then (``identity``)
)
#: keys the job fills in after the skip decision (device/backend ``auto`` resolved,
#: ``compute`` resolved from its profile): older records hold them resolved
RESOLVED_LATER = ("device", "backend", "compute")
#: settings added after records existed, each at the value that does what the code did
#: before it existed: dropped from the identity at that value, so that adding a setting
#: neither re-runs nor refuses a finished job (its records lack the key)
LATER_DEFAULTS: dict[str, Any] = {
    "reducer.selection": "exact",  # Top-k/gTop-k/Ok-Topk: exact top-k (the sampled threshold came later)
    "cluster.dilation": 1,  # emulated cluster: real time (time dilation came later)
    "cluster.min_dilation": 1,  # emulated cluster: no floor under dilation=auto (it came later)
}


def _drop(tree: dict, dotted: str) -> None:
    head, _, rest = dotted.partition(".")
    if head not in tree:
        return
    if not rest:
        del tree[head]
    elif isinstance(tree[head], dict):
        _drop(tree[head], rest)


def _get(tree: dict, dotted: str) -> Any:
    for head in dotted.split("."):
        if not isinstance(tree, dict) or head not in tree:
            return _MISSING
        tree = tree[head]
    return tree


_MISSING = object()


def identity(cfg: Any) -> dict:
    """The settings that define a job's result: ``cfg`` (a DictConfig or a plain dict of
    the composed config) resolved, without ``NEUTRAL`` keys (and without Hydra's node)."""
    from omegaconf import DictConfig, OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else json.loads(json.dumps(cfg))
    tree.pop("hydra", None)
    keep_fault = str((tree.get("fault") or {}).get("kind")).lower() == "nan"  # YAML reads nan as a float
    for key in NEUTRAL:
        if not (key == "fault" and keep_fault):
            _drop(tree, key)
    for key, value in LATER_DEFAULTS.items():
        if _get(tree, key) == value:
            _drop(tree, key)
    return tree


def fingerprint(ident: dict) -> str:
    """sha256 of the identity as canonical JSON (sorted keys; floats as JSON writes them)."""
    text = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def code_version() -> dict:
    """The code that runs: git commit (None outside a checkout) and whether the tree has changes."""
    commit = git_commit()
    dirty = None
    if commit:
        import subprocess

        try:
            out = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent,
                timeout=5,
            )
            dirty = bool(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return {"commit": commit, "dirty": dirty}


def summary_fields(cfg: Any) -> dict:
    """What ``summary.json`` records of the job's identity (``cfg``: the workers' config,
    which carries ``fingerprint`` when the job set it)."""
    return {"fingerprint": cfg.get("fingerprint")}


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}." if isinstance(v, dict) and v else f"{prefix}{k}"))
    return out


def setting(tree: dict, dotted: str) -> Any:
    """The value of setting ``dotted`` in an identity (None when it has none)."""
    value = _get(tree, dotted)
    return None if value is _MISSING else value


def differing_keys(old: dict, new: dict) -> list[str]:
    """The settings (dotted keys, a list's key once) whose values differ, in key order."""
    a, b = _flat(old), _flat(new)
    return [k for k in sorted(set(a) | set(b)) if a.get(k, _MISSING) != b.get(k, _MISSING)]


def differences(old: dict, new: dict, lenient: bool = False) -> list[str]:
    """``key: old -> new`` for each setting that differs, in key order. ``lenient`` (a
    record from before identities: its config.yaml, resolved): keys the job resolves later
    (``RESOLVED_LATER``) and keys only the old record has are not compared."""
    a, b = _flat(old), _flat(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if lenient and (key.split(".")[0] in RESOLVED_LATER or key not in b):
            continue
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            out.append(f"{key}: {a.get(key, '<unset>')!r} -> {b.get(key, '<unset>')!r}")
    return out


@dataclass(frozen=True)
class Verdict:
    """What a run directory holds for a job of identity ``ident``."""

    action: str  # "run" (nothing there: start, or resume a matching checkpoint) | "skip" | "refuse"
    why: str = ""  # refuse: the first settings that differ and what holds them
    value: float | None = None  # skip: the finished job's images/s per worker
    extends: Any = None  # run: the finished run it trains longer (gtopk.records.extension.Extension)


def recorded_identity(run: RunDir) -> tuple[dict | None, bool]:
    """(identity the folder's work was done with, whether it is exact): ``identity.json``'s,
    else (older records) the one read from ``config.yaml`` (not exact: resolved), else None."""
    try:
        return json.loads((run.path / IDENTITY).read_bytes())["identity"], True
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        return identity(run.read_config()), False
    except Exception:  # noqa: BLE001 - no readable config: nothing recorded
        return None, False


def verdict(run_dir: Path, ident: dict, saved_fingerprint: str | None = None, has_checkpoint: bool = False) -> Verdict:
    """Local, read-only. ``saved_fingerprint``/``has_checkpoint``: the newest complete
    checkpoint generation's fingerprint and whether there is one (``gtopk.train.state``)."""
    run = RunDir(run_dir)
    fp = fingerprint(ident)
    try:
        summary = run.read_summary() if run.summary.exists() else None
    except CorruptRecord:  # unreadable: not finished (the job quarantines it under its lock)
        summary = None
    if summary is not None:
        if summary.get("fingerprint") == fp:
            return Verdict("skip", value=summary.get("images_per_s_per_worker"))
        what = f"its {run.summary.name} is of other settings"
    elif has_checkpoint and saved_fingerprint is not None:
        if saved_fingerprint == fp:
            return Verdict("run")
        what = "its checkpoint is of other settings"
    elif has_checkpoint or run.config.exists():
        what = f"its {'checkpoint' if has_checkpoint else CONFIG} is of other settings"
    else:
        return Verdict("run")
    old, exact = recorded_identity(run)
    if old is None:  # a summary or checkpoint without any config: cannot tell
        diff = ["the recorded settings are unreadable"]
    else:
        diff = differences(old, ident, lenient=not exact)
        if not diff:
            if summary is not None and exact:
                diff = ["the fingerprint differs"]
            elif summary is not None:  # older record, same settings: the job finished with them
                return Verdict("skip", value=summary.get("images_per_s_per_worker"))
            else:
                return Verdict("run")
    shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
    return Verdict(
        "refuse",
        f"{run_dir}: {what} ({shown}); pass rerun=true to move the old result aside "
        f"(into {run_dir / SUPERSEDED}/) and run it with these settings, or another name=",
    )


def write_identity(run_dir: Path, ident: dict, extends: dict | None = None) -> None:
    """Record the identity the folder's work is now done with (atomically); ``extends``
    (a run trained longer): the identity and fingerprint of the finished run it continues
    (``gtopk.records.extension``)."""
    record = {"identity": ident, "fingerprint": fingerprint(ident), "code": code_version()}
    if extends is not None:
        record["extends"] = extends
    write_json_atomic(run_dir / IDENTITY, record)


def move_aside(run_dir: Path) -> Path:
    """Move the old result (what a job wrote: ``gtopk.records.claim.own_entries``; never
    the lock, the marker, Hydra's files, older superseded results or anything else found
    there) into ``superseded/<UTC time>/``; returns that folder. Call under the job's lock."""
    dest = run_dir / SUPERSEDED / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
    dest.mkdir(parents=True)
    for p in own_entries(run_dir):
        shutil.move(str(p), str(dest / p.name))
    return dest


def quarantine(path: Path, problem: str) -> Path:
    """Rename an unreadable record aside (``<name>.corrupt-<time>``), with a one-line
    warning (``problem``: what is wrong with it, naming it)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = path.with_name(f"{path.name}.corrupt-{stamp}-{os.getpid()}")
    os.replace(path, dest)
    print(f"warning: {problem}; moved to {dest.name}, the job runs again", file=sys.stderr, flush=True)
    return dest
