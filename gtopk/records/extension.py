"""Training a finished run longer, in its own folder: when a job extends one, and when not.

A job whose run directory holds a finished training run (``summary.json``) of other settings
is normally refused (``gtopk.records.identity.verdict``). It EXTENDS that run instead, resuming
from its checkpoint and training the epochs it lacks, when all of these hold:

* the two identities differ in ``train.epochs`` and otherwise only in the settings that
  shape the schedules over epochs (``SCHEDULE_KEYS``), and the job asks for more epochs;
* neither cuts its epochs (``train.max_iters_per_epoch``: a cut epoch is not the epoch
  that a longer run trains);
* the LR and density schedules the loop runs (``gtopk.train.recipe.schedules``) give the
  same value under both settings at every iteration of the epochs the run trained (so the
  run trained longer is the run trained that long from the start);
* the folder's newest complete checkpoint generation is the finished run's last epoch (or,
  an extension that stopped midway, a generation of the job's own settings).

Otherwise the job is refused in one line naming why and the fix (``rerun=true`` trains it
from scratch, the old result moved aside). While a run is extended its ``summary.json``
stays that of the finished run (the folder reads as finished with the old settings until
the longer run writes its own); ``identity.json`` holds the new identity and, under
``extends``, the one it continues (``identity.write_identity``), so that a stopped extension
is recognised and resumed.

Local and read-only; nothing here is collective.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gtopk.records.identity import differing_keys, fingerprint, setting
from gtopk.records.rundir import IDENTITY, RunDir, iter_jsonl

#: (old config, new config, epochs, iterations per epoch) -> where their schedules first differ, or None
ScheduleDiff = Callable[[Any, Any, int, int], "str | None"]

TRAIN_EPOCHS = "train.epochs"
CUT = "train.max_iters_per_epoch"
#: settings besides ``train.epochs`` that may differ (their schedules then compared):
#: ``model.epochs`` is ``train.epochs``'s default; a prefix covers its subtree
SCHEDULE_KEYS = ("model.epochs", "model.lr_warmup_epochs", "model.lr_milestones", "train.density_warmup")


@dataclass(frozen=True)
class Extension:
    """A finished run of ``old_epochs`` epochs (fingerprint ``old_fingerprint``, identity
    ``old_identity``) trained on to ``new_epochs``."""

    old_fingerprint: str
    old_epochs: int
    new_epochs: int
    old_identity: dict

    def attempt(self) -> dict:
        """What ``attempts.jsonl`` records of the attempt (under ``extended``)."""
        return {"from_epochs": self.old_epochs, "to_epochs": self.new_epochs, "from_fingerprint": self.old_fingerprint}

    def carried(self) -> dict:
        """What ``identity.json`` records of the run continued (under ``extends``)."""
        return {"identity": self.old_identity, "fingerprint": self.old_fingerprint, "epochs": self.old_epochs}


def _identity_record(run: RunDir) -> dict:
    try:
        record = json.loads((run.path / IDENTITY).read_bytes())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def identity_of(run: RunDir, fp: str | None) -> dict | None:
    """The identity whose fingerprint is ``fp`` as the folder records it: ``identity.json``'s,
    or the one it extends (its ``extends``); None when neither is."""
    record = _identity_record(run)
    for rec in (record, record.get("extends") or {}):
        if fp is not None and rec.get("fingerprint") == fp and isinstance(rec.get("identity"), dict):
            return rec["identity"]
    return None


def continued(run_dir: Path, fp: str) -> dict | None:
    """``identity.json``'s ``extends`` when it records the identity ``fp`` as a run trained
    longer (an extension under way, or done): what a later attempt of it keeps."""
    record = _identity_record(RunDir(run_dir))
    return record.get("extends") if record.get("fingerprint") == fp else None


def epochs_apart(old: dict, new: dict) -> int | None:
    """``new``'s ``train.epochs`` minus ``old``'s when the identities differ in it and
    otherwise only in ``SCHEDULE_KEYS`` (the same cell trained for another number of
    epochs); None when they differ in anything else, or not in ``train.epochs``."""
    keys = differing_keys(old, new)
    if TRAIN_EPOCHS not in keys:
        return None
    for key in keys:
        if key != TRAIN_EPOCHS and not any(key == k or key.startswith(k + ".") for k in SCHEDULE_KEYS):
            return None
    a, b = setting(old, TRAIN_EPOCHS), setting(new, TRAIN_EPOCHS)
    return b - a if isinstance(a, int) and isinstance(b, int) else None


def iterations_per_epoch(run: RunDir) -> int | None:
    """The iterations of the run's epoch 0, from rank 0's rows (None: none recorded)."""
    seen: set[int] = set()
    if not run.iters(0).is_file():
        return None
    for row in iter_jsonl(run.iters(0)):
        if (row.get("epoch") or 0) >= 1:
            break
        if row.get("epoch") == 0 and isinstance(row.get("iter"), int):
            seen.add(row["iter"])
    return len(seen) or None


def consider(
    run_dir: Path, ident: dict, generation: dict | None, schedules_differ: ScheduleDiff
) -> Extension | str | None:
    """Whether this job (identity ``ident``) trains the finished run in ``run_dir`` longer:
    an ``Extension``; a one-line refusal naming why and the fix (a finished run of the same
    cell that cannot be extended, or that it would shorten); None when the folder holds
    no such run (the ordinary verdict stands). ``generation``: the folder's newest complete
    checkpoint generation (``gtopk.train.checkpoint.saved_generation``), or None.
    ``schedules_differ``: the training loop's comparison of two configs' schedules
    (``gtopk.train.recipe.first_difference``), passed in by the caller so that the records
    layer does not import the training loop's."""
    run = RunDir(run_dir)
    summary = run.summary_if_readable()
    fp = fingerprint(ident)
    old_fp = None if summary is None else summary.get("fingerprint")
    if old_fp is None or old_fp == fp:
        return None
    old = identity_of(run, old_fp)
    apart = None if old is None or setting(ident, "mode") != "train" else epochs_apart(old, ident)
    if apart is None:
        return None
    was, now = setting(old, TRAIN_EPOCHS), setting(ident, TRAIN_EPOCHS)
    fix = "use rerun=true (moves it aside and trains from scratch) or another name="
    if apart < 0:
        return f"{run_dir} holds a finished run of {was} epochs; {TRAIN_EPOCHS}={now} would shorten it: {fix}"
    head = f"{run_dir} holds a finished run of {was} epochs that {TRAIN_EPOCHS}={now} cannot extend"
    if cap := setting(ident, CUT):  # the same in both (a setting that differs is no extension)
        return f"{head}: its epochs are cut ({CUT}={cap}), and a cut epoch is not a whole one; {fix}"
    per_epoch = iterations_per_epoch(run)
    if per_epoch is None:
        return (
            f"{head}: its iteration rows ({run.iters(0).name}) are missing, so its schedule cannot be compared; {fix}"
        )
    where = schedules_differ(old, ident, was, per_epoch)
    if where is not None:
        changed = ", ".join(k for k in differing_keys(old, ident) if k != TRAIN_EPOCHS) or "the schedule"
        return f"{head} exactly: {changed} would change {where}, an epoch it trained; {fix}"
    ours = generation is not None and generation.get("fingerprint") == fp and generation["epoch"] >= was - 1
    last = generation is not None and generation.get("fingerprint") == old_fp and generation["epoch"] == was - 1
    if not (ours or last):
        held = "it has none" if generation is None else f"its newest is of epoch {generation['epoch']}"
        return (
            f"{head}: it keeps no checkpoint of its last epoch (epoch {was - 1}) to continue from ({held}; a run "
            f"restored from the archive keeps none); rerun=true trains {now} epochs from scratch (the old result "
            "moved aside)"
        )
    return Extension(old_fp, was, now, old)


def replaces(archived: dict | None, new: dict | None) -> bool:
    """Whether a finished run of identity ``new`` may replace the archived copy of identity
    ``archived`` in the same folder: not when it is the same cell trained for fewer epochs
    (``epochs_apart`` < 0); yes otherwise (another cell, or the cell trained longer)."""
    if archived is None or new is None:
        return True
    apart = epochs_apart(archived, new)
    return apart is None or apart > 0
