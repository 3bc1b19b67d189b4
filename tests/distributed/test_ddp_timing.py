"""DDP's communication is measured, not hidden in t_compute: its timing hook leaves the
gradients bit-identical to DDP without it, and a DDP job records the all-reduce time that
backward could not hide as t_commu, with every part of the step still adding up to t_iter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from gtopk.records.rundir import read_jsonl
from gtopk.run.spawn import spawn
from gtopk.train.loop import run_worker
from tests.config import compose_config
from tests.ddp_workers import hooked_and_plain_ddp

PARTS = ("t_data", "t_compute", "t_check", "t_compr", "t_commu", "t_update")
REPLAYED = 0.05  # seconds of replayed compute per step


def test_timing_hook_leaves_ddp_gradients_and_weights_bit_identical():
    # P = 3: DDP scales by 1/3, which dividing by 3 (torch's allreduce_hook) would not match
    out = spawn(hooked_and_plain_ddp, 3, timeout=180)
    for rank, r in enumerate(out):
        assert len(r["plain"]) == len(r["hooked"]) > 0
        for a, b in zip(r["plain"], r["hooked"]):
            assert torch.equal(a, b), f"rank {rank}: the hooked DDP step differs from plain DDP"
        assert r["total"] > 0 and r["exposed"] > 0
    assert all(torch.equal(a, b) for a, b in zip(out[0]["hooked"], out[1]["hooked"]))  # ranks agree


def run_ddp_job(tmp_path: Path, *overrides: str) -> list[dict]:
    """A P = 2 DDP benchmark job (run_worker on loopback, gloo); every rank's timed rows."""
    cfg = compose_config(
        ["reducer=ddp", "nodes=2", "device=cpu", "batch_size=8", "benchmark.warmup=1", "benchmark.iters=3"]
        + ["logger.wandb=false", "data.train_size=64", *overrides]
    )
    spawn(run_worker, 2, (OmegaConf.to_container(cfg, resolve=True), str(tmp_path)), timeout=300)
    rows = [r for rank in range(2) for r in read_jsonl(tmp_path / f"iters.rank{rank}.jsonl")]
    assert len(rows) == 2 * 4
    return rows


def check_accounting(rows: list[dict]) -> None:
    for r in rows:
        where = f"rank {r['rank']} iter {r['iter']}"
        assert r["t_commu"] > 0, f"{where}: DDP's exposed all-reduce time is missing"
        assert r["t_commu_backward"] > 0, f"{where}: no all-reduce was timed inside backward"
        assert all(r[k] >= 0 for k in PARTS), f"{where}: a negative part {r}"
        assert sum(r[k] for k in PARTS) == pytest.approx(r["t_iter"], rel=1e-9, abs=1e-9), where


def test_measured_ddp_job_records_exposed_allreduce_as_communication(tmp_path):
    rows = run_ddp_job(tmp_path, "compute=measured", "grad_accum=2")  # two backward passes per step
    check_accounting(rows)


def test_replayed_ddp_job_keeps_the_replayed_compute_and_reports_the_rest_as_communication(tmp_path):
    rows = run_ddp_job(tmp_path, "compute=replay", f"compute.t_compute={REPLAYED}")
    check_accounting(rows)
    for r in rows:  # the last gradient is ready no sooner than the replayed compute time
        assert r["t_compute"] >= REPLAYED, f"rank {r['rank']} iter {r['iter']}: t_compute {r['t_compute']}"
