"""Every run as pandas DataFrames: ``jobs`` (one row per finished job) and ``epochs`` (one
row per recorded training epoch).

Local records are read from run directories (any folder below the given roots that holds
``config.yaml``): ``summary.json`` for jobs, ``epochs.jsonl`` for epochs (also of jobs
still training). Runs synced to wandb can be added with ``wandb_path="entity/project"``;
this asks the wandb API only when it is asked for and reachable (otherwise a warning,
and the local records alone). A wandb run whose id matches a local run's ``wandb/`` folder
is the same run and is not counted twice.

Columns of ``jobs``: every scalar of ``summary.json`` (reducer, model, nodes, density,
params, batch_per_worker, grad_accum_steps, t_data, t_compute, t_compr, t_commu,
t_update, t_iter, images_per_s_per_worker, cluster, compute, compute_profile, ...), plus
``name`` (the experiment), ``reducer_cfg`` (the reducer's config dict: its ``_target_``
class is what the models dispatch on), ``images_per_iter``, ``run_dir``, ``source``
(local | wandb), ``wandb_id`` and ``env_cpu``, ``env_host``, ``env_git_commit``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.wandb.runs import run_id
from gtopk.records.rundir import RunDir, finished, read_jsonl, run_dirs

ENV_KEYS = ("cpu", "host", "git_commit")
_WANDB_ID = re.compile(r"(?:offline-)?run-\d{8}_\d{6}-([a-z0-9]+)$")


def _wandb_id(run: RunDir) -> str | None:
    for d in sorted(run.wandb.glob("*run-*")):
        m = _WANDB_ID.search(d.name)
        if m:
            return m.group(1)
    return None


def job_row(summary: dict, cfg: dict, run_dir: str, source: str, wandb_id: str | None) -> dict:
    """One ``jobs`` row from a job's summary and resolved config."""
    row = {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}
    env = summary.get("env") or {}
    row.update({f"env_{k}": env.get(k) for k in ENV_KEYS})
    row.update(
        name=cfg.get("name"),
        reducer_cfg=dict(cfg.get("reducer") or {}),
        run_dir=run_dir,
        source=source,
        wandb_id=wandb_id,
    )
    row.setdefault("reducer", cfg.get("reducer_name"))
    row.setdefault("model", cfg.get("model_name"))
    row["images_per_iter"] = int(row["batch_per_worker"]) * int(row.get("grad_accum_steps", 1))
    return row


def load_jobs(
    roots: Iterable[str | Path], wandb_path: str | None = None, wandb_group: str | None = None
) -> pd.DataFrame:
    """One row per finished job under ``roots`` (and, if asked, on wandb)."""
    rows = []
    for d in finished(roots):
        rows.append(job_row(d.read_summary(), d.read_config(), str(d.path), "local", _wandb_id(d)))
    jobs = pd.DataFrame(rows)
    if wandb_path:
        remote, _ = load_wandb(wandb_path, wandb_group)
        jobs = _merge(jobs, remote)
    return jobs


def load_epochs(
    roots: Iterable[str | Path], wandb_path: str | None = None, wandb_group: str | None = None
) -> pd.DataFrame:
    """One row per recorded epoch (``epoch, train_loss, test_loss, test_top1``) of every
    training run under ``roots``, with the run's reducer, model, nodes, density, name."""
    rows = []
    for d in run_dirs(roots):
        epochs = read_jsonl(d.epochs)
        if not epochs:
            continue
        meta = epoch_meta(d.read_config(), str(d.path), "local", _wandb_id(d))
        rows += [{**meta, **e} for e in epochs]
    out = pd.DataFrame(rows)
    if wandb_path:
        _, remote = load_wandb(wandb_path, wandb_group)
        out = _merge(out, remote)
    return out


def epoch_meta(cfg: dict, run_dir: str, source: str, wandb_id: str | None) -> dict:
    """What identifies a training run in ``epochs``."""
    return {
        "name": cfg.get("name"),
        "reducer": cfg.get("reducer_name"),
        "model": cfg.get("model_name"),
        "nodes": cfg.get("nodes"),
        "density": cfg.get("density"),
        "data": cfg.get("data_name"),
        "reducer_cfg": dict(cfg.get("reducer") or {}),
        "run_dir": run_dir,
        "source": source,
        "wandb_id": wandb_id,
    }


def _merge(local: pd.DataFrame, remote: pd.DataFrame) -> pd.DataFrame:
    """Local rows, plus the wandb rows of runs that are not local."""
    if remote.empty:
        return local
    if local.empty:
        return remote
    known = set(local["wandb_id"].dropna()) | {run_id(Path(d)) for d in local["run_dir"]}  # + exported ids
    return pd.concat([local, remote[~remote["wandb_id"].isin(known)]], ignore_index=True)


def wandb_rows(runs: Iterable[Any]) -> tuple[list[dict], list[dict]]:
    """(jobs rows, epochs rows) of wandb runs (objects with ``id``, ``path``, ``config``,
    ``summary`` and ``history()``, as ``wandb.Api().runs`` gives)."""
    jobs, epochs = [], []
    for run in runs:
        cfg, summary = dict(run.config), dict(run.summary)
        cfg = cfg.get("resolved") or cfg  # analysis.wandb.export keeps the job's config there
        where = "wandb:" + "/".join(run.path)
        if "images_per_s_per_worker" in summary and "batch_per_worker" in summary:
            jobs.append(job_row(summary, cfg, where, "wandb", run.id))
        if cfg.get("mode") == "train":
            meta = epoch_meta(cfg, where, "wandb", run.id)
            hist = run.history(keys=["epoch", "train_loss", "test_loss", "test_top1"], pandas=False)
            epochs += [{**meta, **h} for h in hist]
    return jobs, epochs


def load_wandb(path: str, group: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(jobs, epochs) of the runs in wandb project ``path`` (``entity/project``), optionally
    one group (experiment name). Empty frames, with a warning, when wandb is offline or
    unreachable."""
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled"):
        print(f"warning: WANDB_MODE={os.environ['WANDB_MODE']}: not asking wandb for {path}", file=sys.stderr)
        return pd.DataFrame(), pd.DataFrame()
    try:
        import wandb

        runs = wandb.Api(timeout=30).runs(path, filters={"group": group} if group else None)
        jobs, epochs = wandb_rows(runs)
    except Exception as e:  # noqa: BLE001 - offline, no key, no such project: local records only
        print(
            f"warning: could not read wandb runs of {path} ({type(e).__name__}: {e}); using the local records only",
            file=sys.stderr,
        )
        return pd.DataFrame(), pd.DataFrame()
    return pd.DataFrame(jobs), pd.DataFrame(epochs)
