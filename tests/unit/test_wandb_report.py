"""``analysis.wandb.report`` without a network: it refuses offline in one line before
importing anything slow; online (a key in the environment) it builds the report from the
records, and every key its panels name is one the export wrote (read back from the
offline run files). Only ``Report.save`` is replaced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.wandb_records import export, make_runs, offline_runs

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import sys\nfrom analysis.wandb.report import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
    "    print('exit', e.code, [m for m in ('torch', 'wandb', 'pandas', 'wandb_workspaces') if m in sys.modules])"
)


def refuse(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    base.update(HOME=str(tmp_path), NETRC=str(tmp_path / "no-netrc"), **env)
    return subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, env=base, capture_output=True, text=True)


@pytest.mark.parametrize(
    "args, env, says",
    [
        (["--project", "p"], {}, "ENTITY is missing"),
        (["--entity", "me"], {"WANDB_MODE": "offline", "WANDB_API_KEY": "k" * 40}, "WANDB_MODE=offline"),
        (["--entity", "me"], {}, "not logged in to wandb"),
    ],
)
def test_refuses_in_one_line_before_importing_anything_slow(tmp_path, args, env, says):
    out = refuse(tmp_path, args, **env)
    assert out.stdout.strip() == "exit 2 []"  # nothing slow imported
    assert len(out.stderr.splitlines()) == 1 and says in out.stderr and out.stderr.startswith("error: ")


@pytest.fixture
def saved(tmp_path, monkeypatch, capsys):
    """Records on disk, exported offline; then the report of expA built 'online' (a key in
    the environment), with ``Report.save`` recording instead of uploading."""
    import wandb_workspaces.reports.v2 as wr

    from analysis.wandb import report as wandb_report

    make_runs(tmp_path / "runs")
    export(tmp_path / "runs", tmp_path / "out", capsys)
    runs = offline_runs(tmp_path / "out")
    reports = []

    def save(self, draft=False, clone=False):
        reports.append(self)
        return SimpleNamespace(url="https://wandb.example/report")

    monkeypatch.setattr(wr.Report, "save", save)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    return runs, reports, wandb_report, tmp_path / "runs"


def panels_by_heading(report) -> dict[str, list]:
    import wandb_workspaces.reports.v2 as wr

    out: dict[str, list] = {}
    heading = None
    for block in report.blocks:
        if isinstance(block, wr.H2):
            heading = block.text
            out[heading] = []
        elif isinstance(block, wr.PanelGrid):
            out[heading] += [(grid_panel, block.runsets) for grid_panel in block.panels]
    return out


def test_report_panels_name_what_the_export_wrote(saved, capsys):
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    runs, reports, wandb_report, root = saved
    wandb_report.main([str(root), "--entity", "team", "--project", "gtopk", "--experiment", "expA"])
    assert "report: https://wandb.example/report" in capsys.readouterr().out
    (report,) = reports
    assert (report.entity, report.project, report.title) == ("team", "gtopk", "gTop-k S-SGD: expA")
    sections = panels_by_heading(report)
    # expA: fig6 figure + tables fig6, table4, payoff; a benchmark (no convergence), no commmodel
    assert list(sections) == [
        "Scaling efficiency e(P) per reducer",
        "Speedups (Table IV)",
        "Time breakdown",
        "Per-iteration times",
        "Other analysis outputs",
    ]
    analysis = next(r for r in runs.values() if r.job_type == "analysis")
    job = next(r for r in runs.values() if r.group == "expA" and r.job_type == "gtopk")
    keys = {"analysis": set(analysis.summary), "jobs": set(job.summary) | {k for h in job.history for k in h}}
    tables, media = [], []
    for panel, runsets in (p for ps in sections.values() for p in ps):
        panel._to_model()  # serialisable offline
        (rs,) = runsets
        f = expr.expr_to_filters(rs.filters).model_dump()["filters"]
        assert (rs.entity, rs.project) == ("team", "gtopk")
        assert {"op": "=", "key": {"section": "run", "name": "group"}, "value": "expA"}.items() <= f[0].items()
        which = "analysis" if f[1]["op"] == "=" else "jobs"
        assert f[1]["key"]["name"] == "jobType" and f[1]["value"] == "analysis"
        if isinstance(panel, wr.MediaBrowser):
            media += panel.media_keys
        elif isinstance(panel, wr.WeavePanelSummaryTable):
            tables.append(panel.table_name)
        elif isinstance(panel, wr.LinePlot):
            assert {panel.x, *panel.y} <= keys[which]
        elif isinstance(panel, wr.BarPlot):
            assert set(panel.metrics) <= keys[which]
        elif isinstance(panel, wr.ParallelCoordinatesPlot):
            assert {c.metric.name for c in panel.columns} <= set(job.config) | keys[which]
    assert media == ["figure/fig6"] and set(media) <= keys["analysis"]
    assert tables == ["table/fig6", "table/table4", "table/payoff"] and set(tables) <= keys["analysis"]


def test_training_experiment_gets_the_convergence_panels(saved):
    import wandb_workspaces.reports.v2 as wr

    runs, reports, wandb_report, root = saved
    wandb_report.main([str(root), "--entity", "team", "--experiment", "conv"])
    (report,) = reports
    conv = panels_by_heading(report)["Convergence"]
    (train,) = [r for r in runs.values() if r.group == "conv"]
    history_keys = {k for h in train.history for k in h}
    plots = [(p.x, tuple(p.y)) for p, _ in conv if isinstance(p, wr.LinePlot)]
    assert plots == [("epoch", ("train_loss",)), ("epoch", ("test_top1",))]
    assert {"epoch", "train_loss", "test_top1"} <= history_keys and train.metrics["train_loss"] == "epoch"


def test_an_unknown_or_ambiguous_experiment_is_named(saved, capsys):
    _, reports, wandb_report, root = saved
    with pytest.raises(SystemExit, match="conv, expA"):
        wandb_report.main([str(root), "--entity", "team"])
    with pytest.raises(SystemExit, match="no finished jobs of experiment nope"):
        wandb_report.main([str(root), "--entity", "team", "--experiment", "nope"])
    assert reports == []
