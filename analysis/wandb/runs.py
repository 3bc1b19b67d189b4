"""Naming and opening the wandb runs of an export: a stable run id per directory, and
``wandb.init`` for one (used by ``analysis.wandb.export`` for jobs and by
``analysis.wandb.analyses`` for analysis folders)."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parents[2] / "conf" / "config.yaml"


@functools.cache
def default_project() -> str:
    """The wandb project the jobs log to by default: ``logger.project`` of ``conf/config.yaml``."""
    from omegaconf import OmegaConf

    return str(OmegaConf.load(CONFIG).logger.project)


def run_id(path: Path) -> str:
    """The wandb run id of a job (or analysis) directory: stable across exports."""
    return hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:16]


def clear_old(wandb_dir: Path, rid: str) -> None:
    """Remove earlier offline exports of run ``rid`` (one local copy per run to sync)."""
    for old in (wandb_dir / "wandb").glob(f"offline-run-*-{rid}"):
        shutil.rmtree(old, ignore_errors=True)


def init_run(rid: str, mode: str, wandb_dir: Path, project: str, entity: str | None, **kw: Any):
    """``wandb.init`` for an export: given id, resume="allow", no console capture or
    system metrics (nothing runs but the export)."""
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    if mode == "offline":
        clear_old(wandb_dir, rid)
    wandb_dir.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(console="off", x_disable_stats=True, disable_git=True, save_code=False)
    return wandb.init(
        id=rid,
        resume="allow",
        mode=mode,
        dir=str(wandb_dir),
        project=project,
        entity=entity,
        settings=settings,
        reinit="finish_previous",
        **kw,
    )
