"""The types of the record fields that readers use, per record file.

``problems(obj, kind)`` names the fields of a record (a row of ``iters.rank<r>.jsonl``,
``epochs.jsonl`` or ``attempts.jsonl``, or ``summary.json``) whose value has the wrong type;
``gtopk.records.rundir``'s readers leave such a record out (a row) or treat it as unreadable
(a summary) with one warning naming the file. Every field may be null or absent; fields not
named here are not checked. Local.
"""

from __future__ import annotations

import math
from typing import Any

NUMBER, INT, STR, BOOL, DICT = "a number", "an integer", "a string", "true or false", "an object"
FINITE = "a finite number"  # timings, sizes, accuracies, coverage: never inf or NaN (a loss may be)
_INT64 = 2**63

_TIMES = ("t_data", "t_compute", "t_compr", "t_commu", "t_commu_backward", "t_merge", "t_update", "t_iter", "t_check")
_TIMES += ("t_local", "t_rest", "t_commu_last_arrival")

ROW = {t: FINITE for t in _TIMES} | {
    "loss": NUMBER,
    "lr": FINITE,
    "density": FINITE,
    "residual_norm": NUMBER,
    "lost_l1": NUMBER,
    "bytes_sent": FINITE,
    "bytes_recv": FINITE,
    "payload_bytes": FINITE,
    "rss_peak_mb": FINITE,
    "iter": INT,
    "epoch": INT,
    "attempt": INT,
    "rank": INT,
    "update_nnz": INT,
    "selected": INT,
    "messages_sent": INT,
    "dilation": INT,
    "warmup": BOOL,
}
EPOCH = {"epoch": INT, "train_loss": NUMBER, "test_loss": NUMBER, "test_top1": FINITE, "coverage": FINITE}
ATTEMPT = {"attempt": INT, "pid": INT, "started": NUMBER, "commit": STR, "extended": DICT}
SUMMARY = {t: FINITE for t in _TIMES} | {
    "images_per_s_per_worker": FINITE,
    "coverage": FINITE,
    "density": FINITE,
    "bytes_sent_per_iter": FINITE,
    "bytes_recv_per_iter": FINITE,
    "payload_bytes_per_iter": FINITE,
    "rss_peak_mb": FINITE,
    "top1_trend_slope": NUMBER,
    "top1_trend_se": NUMBER,
    "top1_trend_noise": NUMBER,
    "iterations": INT,
    "nodes": INT,
    "params": INT,
    "batch_per_worker": INT,
    "grad_accum_steps": INT,
    "threads_per_worker": INT,
    "dilation": INT,
    "steps_skipped_nonfinite": INT,
    "top1_trend_from_epoch": INT,
    "top1_trend_to_epoch": INT,
    "top1_still_rising": BOOL,
    "batched": BOOL,
    "weights_identical_across_ranks": BOOL,
    "fingerprint": STR,
    "reducer": STR,
    "model": STR,
    "data": STR,
    "mode": STR,
    "cluster": STR,
    "compute": STR,
    "backend": STR,
    "device": STR,
    "env": DICT,
}
#: the schema of each JSON-lines record file, by name (``iters.rank<r>.jsonl``: ROW)
LINES = {"epochs.jsonl": EPOCH, "attempts.jsonl": ATTEMPT}


def schema_of(name: str) -> dict[str, str] | None:
    """The schema of a JSON-lines record file named ``name`` (None: not a record file)."""
    if name.startswith("iters.rank") and name.endswith(".jsonl"):
        return ROW
    return LINES.get(name)


def _fits(value: Any, kind: str) -> bool:
    if value is None:
        return True
    if kind in (NUMBER, FINITE):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(value, int):
            return abs(value) < _INT64
        return kind == NUMBER or math.isfinite(value)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < _INT64
    if kind == STR:
        return isinstance(value, str)
    if kind == BOOL:
        return isinstance(value, bool)
    return isinstance(value, dict)


def problems(obj: dict, schema: dict[str, str]) -> list[str]:
    """``field (want <kind>)`` for each field of ``obj`` whose value ``schema`` does not allow."""
    out = []
    for key, kind in schema.items():
        if key in obj and not _fits(obj[key], kind):
            out.append(f"{key} (want {kind})")
    return out
