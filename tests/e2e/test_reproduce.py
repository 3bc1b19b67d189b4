"""`make reproduce-fig6` end to end with tiny iteration counts: netbench, the
``run.py -m experiment=fig6_reproduce`` sweep (the paper's three methods; the jobs of one P in
one group of workers), the v_1 jobs (DDP at P = 1), the analysis scripts (Fig. 6, Table IV,
the breakdown, the model check), the offline wandb export of every job and the analysis; then
`make reproduce-fig6-baselines` into the same runs (DDP's replayed backward, Ok-Topk). On the
emulated 1 Gbit/s cluster where root and ip/tc exist, else on loopback (the target's own
fallback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gtopk.records.rundir import read_jsonl
from gtopk.run.cluster.netns import unavailable_reason
from tests.wandb_records import offline_runs

ROOT = Path(__file__).resolve().parents[2]
SMALL = "model=resnet20 benchmark.warmup=1 benchmark.iters=1 batch_size=8"
TINY = f"{SMALL} nodes=1,2"
NETBENCH = "pingpong.reps=2 pingpong.sizes=[8,65536,1048576]"


def make(target: str, runs: Path, wandb_dir: Path, args: str = TINY, *extra: str) -> str:
    """``make <target>`` as a user types it (no WANDB_* setting of theirs), its wandb export in ``wandb_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")} | {"WANDB_DIR": str(wandb_dir)}
    out = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT),
            target,
            f"ARGS=hydra.sweep.dir={runs} {args}",
            f"NETBENCH_ARGS={NETBENCH}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


@pytest.mark.slow  # 16 jobs on the emulated cluster; its analysis is in make test (tests/unit/test_analysis.py)
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_reproduce_fig6_smoke(tmp_path):
    runs, wandb_dir = tmp_path / "fig6", tmp_path / "wandb"
    log = make("reproduce-fig6", runs, wandb_dir, TINY, "VARIANTS=selection=sampled")
    cluster = "emulated" if unavailable_reason() is None else "local"
    assert ("WARNING: cannot emulate" in log) == (cluster == "local")
    assert f"Outputs in {runs / 'analysis'}" in log
    for name in ("fig6.png", "fig6.pdf", "fig6.csv", "commmodel.png", "commmodel.csv", "table4.md", "breakdown.png"):
        assert (runs / "analysis" / name).stat().st_size > 0
    fig6 = pd.read_csv(runs / "analysis" / "fig6.csv")
    ours = fig6[fig6["kind"] != "paper"]
    assert set(ours["cluster"]) == {cluster} and set(ours["compute"]) == {"replay"}
    measured = ours[ours["kind"] == "measured"]
    sampled = [f"{r} selection=sampled" for r in ("topk", "gtopk")]  # the variant sweep, by label
    three = {(r, p) for r in ("dense", "topk", "gtopk", *sampled) for p in (1, 2)}
    assert set(zip(measured["reducer"], measured["nodes"])) == three | {("ddp", 1)}  # + the v_1 job
    assert set(ours[ours["kind"] == "modelled"]["nodes"]) == {1, 2, 16, 32}
    assert measured.set_index(["reducer", "nodes"]).loc[("ddp", 1), "efficiency"] == pytest.approx(1.0)  # v_1
    for nodes in (1, 2):  # the sweep's `nodes` axis comes first: the 3 jobs of a P share one group
        jobs = [j for j in runs.glob(f"*,nodes={nodes},*") if "selection=" not in j.name and "=ddp" not in j.name]
        assert len(jobs) == 3 and len({r["pid"] for j in jobs for r in read_jsonl(j / "iters.rank0.jsonl")}) == 1

    # the baselines beside them, into the same runs (its calibration is the one above)
    wandb_dir = tmp_path / "wandb_all"
    log = make("reproduce-fig6-baselines", runs, wandb_dir, f"{SMALL} nodes=2 reducer=ddp,oktopk")
    assert "gtopk.perf.netbench" not in log
    fig6 = pd.read_csv(runs / "analysis" / "fig6.csv")
    measured = fig6[fig6["kind"] == "measured"]
    assert set(zip(measured["reducer"], measured["nodes"])) == three | {("ddp", 1), ("ddp", 2), ("oktopk", 2)}

    exported = offline_runs(wandb_dir)  # every job and the analysis folder, offline, read back
    jobs = sorted(p.parent for p in runs.glob("*/summary.json"))
    assert len(jobs) == 13 and len(exported) == 14 and "13 job run(s) and 1 analysis run(s) exported (offline)" in log
    for job in jobs:
        cfg, summary = yaml.safe_load((job / "config.yaml").read_text()), json.loads((job / "summary.json").read_text())
        run = next(r for r in exported.values() if r.config.get("run_dir") == str(job.resolve()))
        assert (run.group, run.job_type, run.config["nodes"]) == ("fig6_reproduce", cfg["reducer_name"], cfg["nodes"])
        assert [h["iteration"] for h in run.history] == [r["iter"] for r in read_jsonl(job / "iters.rank0.jsonl")]
        assert run.summary["t_iter"] == summary["t_iter"]
    (analysis,) = [r for r in exported.values() if r.job_type == "analysis"]
    columns, rows = analysis.table("table/fig6")
    assert columns == list(fig6.columns) and len(rows) == len(fig6)
    # Table IV (every measured P) and the breakdown (the largest P) come with the figure
    for stem, measured_nodes in (("table4", {1, 2}), ("breakdown", {2})):
        on_disk = pd.read_csv(runs / "analysis" / f"{stem}.csv")
        columns, rows = analysis.table(f"table/{stem}")
        assert columns == list(on_disk.columns) and len(rows) == len(on_disk)
        assert set(on_disk.loc[on_disk["kind"] == "measured", "nodes"]) == measured_nodes
    for stem in ("fig6", "breakdown"):
        assert analysis.summary[f"figure/{stem}"]["_type"] == "image-file"

    table = pd.read_csv(runs / "analysis" / "table4.csv")  # written by reproduce-fig6 from the same runs
    row = table[(table["kind"] == "measured") & (table["nodes"] == 2)].iloc[0]
    assert row["oktopk/dense"] == pytest.approx(row["e_oktopk"] / row["e_dense"])
    assert row["gtopk/ddp"] == pytest.approx(row["e_gtopk"] / row["e_ddp"])
    label = "gtopk selection=sampled"  # a setting over its reducer at the yaml's
    assert row[f"{label}/gtopk"] == pytest.approx(row[f"e_{label}"] / row["e_gtopk"])
    assert (runs / "analysis" / "table4.md").exists()


@pytest.mark.slow  # ~30 s; its analysis is in make test (tests/unit/test_analysis.py, hand-built records)
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_reproduce_fig5_quick_smoke(tmp_path):
    """``make reproduce-fig5`` with its sweep cut down (P = 2, two reducers, 2 epochs of 2
    iterations on 128 digits): simulated training, the figure, the table, the gap plot,
    the CSVs and the offline wandb runs."""
    runs, wandb_dir = tmp_path / "fig5", tmp_path / "wandb"
    tiny = (
        "nodes=2 reducer=dense,gtopk train.epochs=2 train.max_iters_per_epoch=2 data.train_size=128 data.test_size=64"
    )
    log = make("reproduce-fig5", runs, wandb_dir, tiny)
    assert f"Outputs in {runs / 'analysis'}" in log
    for name in ("fig5.png", "fig5.csv", "fig5_table.csv", "fig5_table.md", "fig5_gap.png", "fig5_gap.csv"):
        assert (runs / "analysis" / name).stat().st_size > 0
    jobs = sorted(p.parent for p in runs.glob("*/summary.json"))
    assert len(jobs) == 2
    for job in jobs:
        cfg = yaml.safe_load((job / "config.yaml").read_text())
        assert cfg["cluster"]["_target_"].endswith("SimulatedCluster") and cfg["data_name"] == "digits"
        assert [e["epoch"] for e in read_jsonl(job / "epochs.jsonl")] == [0, 1]
    table = pd.read_csv(runs / "analysis" / "fig5_table.csv").set_index("reducer")
    assert set(table.index) == {"dense", "gtopk"} and set(table["iterations"]) == {4}
    curves = pd.read_csv(runs / "analysis" / "fig5.csv")
    assert len(curves) == 4 and set(curves["iterations"]) == {2, 4}
    exported = offline_runs(wandb_dir)
    assert len(exported) == 3 and "2 job run(s) and 1 analysis run(s) exported (offline)" in log
    (analysis,) = [r for r in exported.values() if r.job_type == "analysis"]
    columns, rows = analysis.table("table/fig5_table")
    assert len(rows) == 2
