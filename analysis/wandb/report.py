"""A wandb report for one experiment: ``python -m analysis.wandb.report --entity E --project P
[--experiment NAME] [RUNS...]`` (``make wandb-report ENTITY=... PROJECT=... [EXPERIMENT=...]``).

Online only: it refuses in one line, before importing anything slow, when ENTITY is
missing, ``WANDB_MODE`` is offline/disabled or no wandb login is found. The runs must be
on the server first (``make wandb-export`` online, or offline then ``make wandb-sync``).

The report (``wandb-workspaces``) has the panels users compare, each section present
when the experiment has its data (figures and tables from the experiment's analysis run,
live panels from its job runs):

* scaling efficiency e(P) per reducer: Fig. 6 and its table; throughput per job over
  reducer, model and P (parallel coordinates);
* speedups: Table IV;
* time breakdown: the breakdown figure and table; median t_compute / t_compr / t_commu /
  t_update per job;
* convergence (training jobs): training loss and top-1 per epoch; Fig. 5 / density;
* per-iteration times (t_iter, t_commu over ``iteration``), the communication model, and
  any other figure or table of the analysis folder (e.g. a payoff map).

The experiment's panels are chosen from the local records under RUNS (default runs/),
the source of truth the runs were exported from.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.wandb.online import why_not_online
from analysis.wandb.runs import default_project

#: (heading, text, figure stems, table stems, job panels) in report order
SECTIONS = (
    (
        "Scaling efficiency e(P) per reducer",
        "e(P) = v_P / v_1 per model, one line per reducer: measured, modelled (alpha-beta) and the paper's "
        "(analysis.figures.fig6); below, each job's throughput.",
        ("fig6",),
        ("fig6",),
        "throughput",
    ),
    (
        "Speedups (Table IV)",
        "e(P) per reducer and the speedups of gTop-k (analysis.figures.table4).",
        (),
        ("table4",),
        None,
    ),
    (
        "Time breakdown",
        "Per-iteration time split into compute, top-k selection, communication and the rest (analysis.figures.breakdown); "
        "below, each job's medians.",
        ("breakdown",),
        ("breakdown",),
        "breakdown",
    ),
    (
        "Convergence",
        "Training loss and top-1 test accuracy per epoch (analysis.figures.fig5).",
        ("fig5", "density"),
        ("fig5", "density"),
        "convergence",
    ),
    ("Per-iteration times", "Medians over ranks of each iteration, warm-up included.", (), (), "iterations"),
    (
        "Communication model",
        "Measured against predicted t_commu (analysis.figures.commmodel).",
        ("commmodel",),
        ("commmodel",),
        None,
    ),
)
OTHER = "Other analysis outputs"
BREAKDOWN = ("t_compute", "t_compr", "t_commu", "t_update")


@dataclass
class Experiment:
    """What the report shows, from the local records."""

    name: str
    figures: set[str]
    tables: set[str]
    modes: set[str]
    commits: list[str]
    networks: list[str]


def runsets(entity: str, project: str, name: str) -> dict[str, Any]:
    """The experiment's analysis run and its job runs (train-mode jobs apart)."""
    import wandb_workspaces.reports.v2 as wr

    group = f"Metric('Group') = '{name}'"
    return {
        "analysis": wr.Runset(entity, project, "analysis", filters=f"{group} and Metric('JobType') = 'analysis'"),
        "jobs": wr.Runset(entity, project, "jobs", filters=f"{group} and Metric('JobType') != 'analysis'"),
        "train": wr.Runset(entity, project, "training jobs", filters=f"{group} and Config('mode') = 'train'"),
    }


def job_panels(kind: str) -> tuple[str, list[Any]]:
    """(runset, live panels over the job runs) of a section."""
    import wandb_workspaces.reports.v2 as wr

    if kind == "throughput":
        cols = [
            wr.Config("reducer"),
            wr.Config("model"),
            wr.Config("nodes"),
            wr.SummaryMetric("images_per_s_per_worker"),
        ]
        pcp = wr.ParallelCoordinatesPlot(
            title="images/s per worker by reducer, model and P",
            columns=[wr.ParallelCoordinatesPlotColumn(metric=c) for c in cols],
            layout=wr.Layout(w=24, h=8),
        )
        return "jobs", [pcp]
    if kind == "breakdown":
        bar = wr.BarPlot(title="median time per iteration (s)", metrics=list(BREAKDOWN), layout=wr.Layout(w=24, h=10))
        return "jobs", [bar]
    if kind == "convergence":
        return "train", [
            wr.LinePlot(title="training loss", x="epoch", y=["train_loss"]),
            wr.LinePlot(title="top-1 test accuracy", x="epoch", y=["test_top1"]),
        ]
    return "jobs", [
        wr.LinePlot(title="t_iter (s)", x="iteration", y=["t_iter"]),
        wr.LinePlot(title="t_commu (s)", x="iteration", y=["t_commu"]),
    ]


def file_panels(figures: list[str], tables: list[str]) -> list[Any]:
    """The analysis run's figures and tables as panels."""
    import wandb_workspaces.reports.v2 as wr

    panels: list[Any] = [
        wr.MediaBrowser(title=s, media_keys=[f"figure/{s}"], layout=wr.Layout(w=24, h=12)) for s in figures
    ]
    panels += [wr.WeavePanelSummaryTable(table_name=f"table/{s}", layout=wr.Layout(w=24, h=10)) for s in tables]
    return panels


def build_report(entity: str, project: str, exp: Experiment):
    """The report object (not saved)."""
    import wandb_workspaces.reports.v2 as wr

    sets = runsets(entity, project, exp.name)
    intro = (
        f"Experiment `{exp.name}` (wandb group {exp.name}): runs exported from the records on disk by "
        f"analysis.wandb.export. Commit(s): {', '.join(exp.commits) or 'unknown'}. "
        f"Network profile(s): {', '.join(exp.networks) or 'none'}."
    )
    blocks: list[Any] = [wr.P(intro)]
    shown: set[str] = set()
    for heading, text, figs, tabs, live in SECTIONS:
        figs = [s for s in figs if s in exp.figures]
        tabs = [s for s in tabs if s in exp.tables]
        live = None if live == "convergence" and "train" not in exp.modes else live
        if not (figs or tabs or live):
            continue
        shown |= set(figs) | set(tabs)
        section: list[Any] = [wr.H2(heading), wr.P(text)]
        if figs or tabs:
            section.append(wr.PanelGrid(runsets=[sets["analysis"]], panels=file_panels(figs, tabs)))
        if live:
            which, panels = job_panels(live)
            section.append(wr.PanelGrid(runsets=[sets[which]], panels=panels))
        blocks += section
    rest_f, rest_t = sorted(exp.figures - shown), sorted(exp.tables - shown)
    if rest_f or rest_t:
        blocks += [wr.H2(OTHER), wr.PanelGrid(runsets=[sets["analysis"]], panels=file_panels(rest_f, rest_t))]
    return wr.Report(
        entity=entity,
        project=project,
        title=f"gTop-k S-SGD: {exp.name}"[:128],
        description=f"Experiment {exp.name}: scaling efficiency, speedups, time breakdown, convergence",
        blocks=blocks,
        width="fluid",
    )


def experiment(roots: list[Path], name: str | None) -> Experiment:
    """The experiment ``name`` (or the only one) under ``roots``, from the local records."""
    from analysis.wandb.analyses import analysis_dirs, experiment_of, network_profiles
    from analysis.wandb.export import finished_jobs

    jobs, _ = finished_jobs(roots)
    names = sorted({str(j.config.get("name")) for j in jobs})
    if name is None:
        if len(names) != 1:
            raise SystemExit(
                f"error: pick an experiment with EXPERIMENT= (--experiment): {', '.join(names) or 'none'} under {' '.join(map(str, roots))}"
            )
        name = names[0]
    mine = [j for j in jobs if str(j.config.get("name")) == name]
    if not mine:
        raise SystemExit(
            f"error: no finished jobs of experiment {name} under {' '.join(map(str, roots))} (found: {', '.join(names) or 'none'})"
        )
    folders = [d for d in analysis_dirs(roots) if experiment_of(d, jobs)[0] == name]
    return Experiment(
        name=name,
        figures={p.stem for d in folders for p in d.glob("*.png")},
        tables={p.stem for d in folders for p in d.glob("*.csv")},
        modes={str(j.config.get("mode")) for j in mine},
        commits=sorted({c for j in mine if (c := (j.summary.get("env") or {}).get("git_commit"))}),
        networks=sorted({k for d in folders for k in network_profiles(d.parent)}),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*", default=["runs"], help="folders holding the runs (default runs)")
    ap.add_argument("--entity", help="wandb user or team")
    ap.add_argument(
        "--project",
        default=default_project(),
        help=f"wandb project the runs were exported to (default {default_project()}: conf/config.yaml's logger.project)",
    )
    ap.add_argument("--experiment", help="experiment name (wandb group); default: the only one under RUNS")
    args = ap.parse_args(argv)
    reason = why_not_online(args.entity)
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        raise SystemExit(2)
    report = build_report(args.entity, args.project, experiment([Path(r) for r in args.roots], args.experiment))
    saved = report.save()
    print(f"report: {saved.url}")


if __name__ == "__main__":
    main()
