"""Harness overhead: the share of an iteration that is neither compute, nor selection,
nor communication, for ResNet-20 at P = 1 with the paper's batch (128), gTop-k, rho 0.001.

One ``run.py`` job in a subprocess (the real launcher, worker and records); from its
``iters.rank0.jsonl``, per timed iteration, ``(t_iter - t_compute - t_compr - t_commu) /
t_iter``. The median ratio and the medians of its parts go to the benchmark's extra_info
and to the session summary. The benchmark's own time is the whole job's wall time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.results import HARNESS

ROOT = Path(__file__).resolve().parents[2]
WARMUP, ITERS = 3, 30
PARTS = ("t_data", "t_compute", "t_compr", "t_commu", "t_update", "t_check", "t_iter")


def overhead_figures(rows: list[dict]) -> dict[str, float]:
    """Median overhead ratio and medians of the parts over the non-warm-up rows."""
    timed = [r for r in rows if not r.get("warmup")]
    overhead = [r["t_iter"] - r["t_compute"] - r["t_compr"] - r["t_commu"] for r in timed]
    out = {
        "iterations": float(len(timed)),
        "overhead_ratio": statistics.median(o / r["t_iter"] for o, r in zip(overhead, timed)),
        "overhead": statistics.median(overhead),
    }
    out.update({p: statistics.median(r[p] for r in timed) for p in PARTS if all(p in r for r in timed)})
    return out


def run_job(run_dir: Path) -> None:
    cmd = [
        sys.executable,
        "run.py",
        "nodes=1",
        "model=resnet20",
        "experiment=fig6_scaling",
        "reducer=gtopk",
        "density=0.001",
        f"benchmark.warmup={WARMUP}",
        f"benchmark.iters={ITERS}",
        "logger.wandb=false",
        f"hydra.run.dir={run_dir}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def test_harness_overhead(benchmark):
    run_dir = ROOT / "runs" / "bench" / time.strftime("harness-%Y%m%d-%H%M%S")
    benchmark.extra_info.update(
        model="resnet20",
        nodes=1,
        batch=128,
        reducer="gtopk",
        warmup=WARMUP,
        iters=ITERS,
        run_dir=str(run_dir.relative_to(ROOT)),
    )
    load_before = os.getloadavg()[0]  # other processes on the CPU inflate every part
    benchmark.pedantic(run_job, args=(run_dir,), rounds=1, iterations=1)
    benchmark.extra_info.update(loadavg_1min_before=load_before, loadavg_1min_after=os.getloadavg()[0])
    rows = [json.loads(line) for line in (run_dir / "iters.rank0.jsonl").read_text().splitlines()]
    figures = overhead_figures(rows)
    assert figures["iterations"] == ITERS  # the job recorded every timed iteration
    benchmark.extra_info.update(figures)
    HARNESS.update(figures, loadavg=max(load_before, os.getloadavg()[0]))
