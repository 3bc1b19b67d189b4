"""``make wandb-export`` as a user runs it, on a real ``run.py`` job: the offline run,
read back from its .wandb file, holds the job's config.yaml, per-iteration medians of its
iters.rank*.jsonl, its summary.json and environment."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml

from gtopk.records.rundir import read_jsonl
from tests.procs import FAST, run
from tests.wandb_records import offline_runs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # in make test: test_reproduce reads every exported job of make reproduce-fig6 back
def test_a_real_job_exported_offline_reads_back_as_its_records(tmp_path):
    done = run("-m", f"hydra.sweep.dir={tmp_path / 'runs'}", "reducer=gtopk", "nodes=2", "density=0.01", *FAST)
    assert done.returncode == 0, done.stderr[-3000:]
    (job,) = [p.parent for p in (tmp_path / "runs").glob("*/summary.json")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "out"))
    out = subprocess.run(
        ["make", "--no-print-directory", "wandb-export", f"RUNS={tmp_path / 'runs'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "1 job run(s) and 0 analysis run(s) exported (offline)" in out.stdout
    (exported,) = offline_runs(tmp_path / "out").values()
    cfg = yaml.safe_load((job / "config.yaml").read_text())
    summary = json.loads((job / "summary.json").read_text())
    assert (exported.group, exported.job_type) == (cfg["name"], "gtopk")
    assert (exported.config["nodes"], exported.config["density"]) == (2, 0.01)
    assert exported.config["algorithm"] == cfg["reducer"]["algorithm"]
    assert exported.config["env"] == summary["env"]
    ranks = [read_jsonl(job / f"iters.rank{r}.jsonl") for r in range(2)]
    assert [h["iteration"] for h in exported.history] == [row["iter"] for row in ranks[0]] == [0, 1, 2]
    for h, rows in zip(exported.history, zip(*ranks)):
        assert h["t_iter"] == statistics.median(r["t_iter"] for r in rows)
        assert h["t_commu_last_arrival"] == min(r["t_commu"] for r in rows)
        assert h["warmup"] == rows[0]["warmup"]
    assert {k: exported.summary[k] for k in summary if k != "env"} == {k: v for k, v in summary.items() if k != "env"}
