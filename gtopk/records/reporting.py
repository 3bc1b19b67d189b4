"""Rank-0 reporting: progress lines and wandb (offline unless configured)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


class Progress:
    """Progress on rank 0: live on a terminal, at most one line per ``every_s`` otherwise."""

    def __init__(self, enabled: bool, every_s: float = 10.0, prefix: str = ""):
        self.enabled, self.every_s, self.prefix = enabled, every_s, prefix
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def show(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            sys.stderr.write(f"\r{self.prefix}{text}\033[K" + ("\n" if force else ""))
            sys.stderr.flush()
        elif force or now - self.last >= self.every_s:
            print(f"{self.prefix}{text}", file=sys.stderr, flush=True)
            self.last = now


class WandbLogger:
    """wandb on rank 0. Mode: WANDB_MODE if set, else ``logger.mode`` (default offline);
    files under the run directory. Group = experiment name; run name like
    ``gtopk-resnet20-p8-d0.001``; tags reducer, model, nodes, density."""

    def __init__(self, cfg, run_dir: Path, meta: dict):
        self.run = None
        if not cfg.logger.wandb:
            return
        import wandb
        from omegaconf import OmegaConf

        os.environ.setdefault("WANDB_SILENT", "true")
        name = f"{meta['reducer']}-{meta['model']}-p{meta['nodes']}-d{meta['density']}"
        self.run = wandb.init(
            project=cfg.logger.project,
            group=cfg.name,
            name=name,
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", cfg.logger.mode),
            tags=[
                f"reducer:{meta['reducer']}",
                f"model:{meta['model']}",
                f"nodes:{meta['nodes']}",
                f"density:{meta['density']}",
                f"mode:{meta['mode']}",
            ],
            config=OmegaConf.to_container(cfg, resolve=True),
            reinit="finish_previous",
        )

    def log(self, row: dict) -> None:
        if self.run:
            self.run.log(row)

    def summary(self, summary: dict) -> None:
        if self.run:
            self.run.summary.update({k: v for k, v in summary.items() if not isinstance(v, dict)})

    def finish(self) -> None:
        if self.run:
            self.run.finish()
            self.run = None
