"""One wandb run per experiment's ``analysis/`` folder (called by ``analysis.wandb.export``).

What the analysis scripts wrote (``analysis/README.md``), as a report can embed it:

* every figure ``<stem>.png`` as ``figure/<stem>`` (``wandb.Image``): fig6, breakdown,
  commmodel, fig5, density, ...;
* every table ``<stem>.csv`` as ``table/<stem>`` (``wandb.Table``, missing values empty):
  fig6 (efficiencies), table4 (Table IV: e(P) and speedups), breakdown, commmodel, fig5 /
  density (the curves), a payoff map when present, ...

The run (job_type ``analysis``, group = the experiment of the jobs beside the folder, id
from the folder's path) is tagged and configured with the git commit(s) of those jobs and
of the export, and with the network profile(s) found beside the jobs
(``<runs>/net/*/profile.json``: name, alpha, beta, bandwidth, cluster).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

ANALYSIS = "analysis"
PROFILE_GLOB = "net/*/profile.json"
TAG_MAX = 64  # wandb's longest tag


def analysis_dirs(roots: list[Path]) -> list[Path]:
    """``analysis/`` folders holding a figure or a table, under (or being) ``roots``."""
    found = set()
    for root in roots:
        candidates = [root] if root.name == ANALYSIS else []
        candidates += [d for d in root.rglob(ANALYSIS) if "wandb" not in d.relative_to(root).parts]
        found |= {d for d in candidates if d.is_dir() and (any(d.glob("*.png")) or any(d.glob("*.csv")))}
    return sorted(found)


def network_profiles(folder: Path) -> dict[str, dict[str, Any]]:
    """Network profiles (``net/<setting>/profile.json``) beside an experiment's jobs, by
    setting; the fit's samples left out."""
    out = {}
    for path in sorted(folder.glob(PROFILE_GLOB)):
        prof = json.loads(path.read_text())
        beta = prof.get("beta") or 0.0
        out[path.parent.name] = {
            "name": prof.get("name"),
            "alpha": prof.get("alpha"),
            "beta": beta,
            "bits_per_s": 8.0 / beta if beta > 0 else None,
            "cluster": prof.get("cluster"),
            "path": str(path.resolve()),
        }
    return out


def table_rows(csv: Path) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of a CSV as the analysis wrote it; missing values None."""
    import pandas as pd

    df = pd.read_csv(csv)
    rows = [[None if isinstance(v, float) and math.isnan(v) else v for v in row] for row in df.itertuples(index=False)]
    return [str(c) for c in df.columns], [[v.item() if hasattr(v, "item") else v for v in r] for r in rows]


def experiment_of(folder: Path, jobs: list[Any]) -> tuple[str, list[Any]]:
    """(experiment name, the jobs) of the runs an analysis folder was made from: the
    finished jobs under its parent (several names joined by +; none: the parent's name)."""
    mine = [j for j in jobs if folder.parent in j.run_dir.parents]
    names = sorted({str(j.config.get("name")) for j in mine})
    return ("+".join(names) if names else folder.parent.name), mine


def export_analysis(folder: Path, jobs: list[Any], mode: str, wandb_dir: Path, project: str | None, entity) -> str:
    """One analysis folder -> one wandb run; returns its id."""
    import wandb

    from analysis.wandb.runs import default_project, init_run, run_id
    from gtopk.records.summary import git_commit

    name, mine = experiment_of(folder, jobs)
    commits = sorted({c for j in mine if (c := (j.summary.get("env") or {}).get("git_commit"))})
    profiles = network_profiles(folder.parent)
    projects = {(j.config.get("logger") or {}).get("project") for j in mine} - {None}
    tags = [f"commit:{c[:12]}" for c in commits] + [f"network:{k}"[:TAG_MAX] for k in profiles]
    rid = run_id(folder)
    run = init_run(
        rid,
        mode,
        wandb_dir,
        project or (sorted(projects)[0] if projects else default_project()),
        entity,
        group=name,
        job_type=ANALYSIS,
        name=f"analysis-{name}",
        tags=tags,
        config={
            "experiment": name,
            "git_commit": ",".join(commits) or None,
            "analysis_git_commit": git_commit(),
            "network_profile": ",".join(profiles) or None,
            "network": profiles,
            "analysis_dir": str(folder.resolve()),
            "jobs": len(mine),
        },
    )
    logged: dict[str, Any] = {}
    for png in sorted(folder.glob("*.png")):
        logged[f"figure/{png.stem}"] = wandb.Image(str(png), caption=png.name)
    for csv in sorted(folder.glob("*.csv")):
        columns, rows = table_rows(csv)
        logged[f"table/{csv.stem}"] = wandb.Table(columns=columns, data=rows, allow_mixed_types=True)
    run.log(logged)
    run.finish()
    return rid


def export_analyses(roots: list[Path], jobs: list[Any], mode: str, wandb_dir: Path, project, entity) -> int:
    """Every analysis folder under ``roots``; returns how many were exported."""
    folders = analysis_dirs(roots)
    for folder in folders:
        rid = export_analysis(folder, jobs, mode, wandb_dir, project, entity)
        print(f"exported {folder} -> analysis run {rid}")
    return len(folders)
