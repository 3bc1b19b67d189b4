"""Compute profiles on disk: where they live, what names an entry, reading and adding one.

A profile maps ``profile_key(cfg)`` (model, batch x accumulation, device) to a measurement
at P = 1 (``images_per_s``, ...). ``LOCAL_PROFILE`` is this machine's, written by
``gtopk.run.measure_compute`` and read by compute replay (``gtopk.train.compute``) and the
analysis (``analysis.payoff``); ``compute.profile=<path>`` names another one.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

from gtopk.records.rundir import write_json_atomic

LOCAL_PROFILE = Path("runs/profiles/local.json")


class ProfileError(ValueError):
    """A replay profile cannot give t_compute for this job; the message says why and how."""


def profile_key(cfg: Any) -> str:
    """The entry of a job's model, batch and device: ``<model>/b<batch>x<accum>/<device>``."""
    return f"{cfg.model_name}/b{cfg.batch_size}x{cfg.grad_accum}/{cfg.device}"


def read_profile(path: Path) -> dict:
    """The profile at ``path`` ({} when there is none yet)."""
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError(f"compute profile {path} is not valid JSON ({e}); delete it to re-measure") from None


def save_local_entry(key: str, entry: dict) -> None:
    """Add ``entry`` (a measurement at P = 1, made by ``gtopk.run.measure_compute``) to the
    local profile under ``key`` (read-modify-write under a lock: concurrent jobs)."""
    LOCAL_PROFILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCAL_PROFILE.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        table = read_profile(LOCAL_PROFILE)
        table[key] = entry
        write_json_atomic(LOCAL_PROFILE, table)
