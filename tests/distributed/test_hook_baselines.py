"""The DDP hook baselines in real jobs (run_worker on loopback, gloo): what their records
say was sent, with DDP's accounting, over several buckets at P = 3 (PowerSGD's chained
P and Q all-reduces would pair different collectives across gloo ranks if a bucket did
not wait for the one before)."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from gtopk.perf.model import param_shapes
from gtopk.records.rundir import read_jsonl
from gtopk.reducers.costmodel import ddp_buckets, powersgd_allreduces
from gtopk.run.spawn import spawn
from gtopk.train.loop import run_worker
from tests.config import compose_config
from tests.distributed.test_ddp_timing import check_accounting

P, BUCKET_MB = 3, 0.1  # ResNet-20 (0.27 M parameters) in 11 buckets


def job(tmp_path, reducer: str, P: int = P) -> tuple[list[dict], int, list]:
    cfg = compose_config(
        [f"reducer={reducer}", f"reducer.bucket_mb={BUCKET_MB}", f"nodes={P}", "device=cpu", "compute=replay"]
        + ["compute.t_compute=0.05", "benchmark.warmup=2", "benchmark.iters=2", "logger.wandb=false"]
    )
    spawn(run_worker, P, (OmegaConf.to_container(cfg, resolve=True), str(tmp_path)), timeout=300)
    rows = [r for rank in range(P) for r in read_jsonl(tmp_path / f"iters.rank{rank}.jsonl")]
    shapes = param_shapes(cfg.model)
    return rows, sum(math.prod(s) for s in shapes), shapes


@pytest.mark.slow
def test_fp16_records_two_bytes_per_entry(tmp_path):
    rows, m, _ = job(tmp_path, "ddp_fp16")
    check_accounting([r for r in rows if not r["warmup"]])
    assert all(r["payload_bytes"] == 2 * m for r in rows)


@pytest.mark.slow
def test_powersgd_records_what_the_hook_compressed_over_many_buckets(tmp_path):
    rows, m, shapes = job(tmp_path, "powersgd")
    check_accounting([r for r in rows if not r["warmup"]])
    buckets = ddp_buckets(shapes, BUCKET_MB)
    sent = [n for b in buckets for n in powersgd_allreduces(b, 2, 2.0)]
    for r in rows:
        if r["iter"] < 2:  # start_powerSGD_iter = 2: plain all-reduces of the fp32 buckets
            assert r["payload_bytes"] == 4 * m
        else:  # Ps, Qs and the small tensors of DDP's rebuilt buckets, as the model counts them
            assert r["payload_bytes"] == 4 * sum(sent) < m
            assert r["messages_sent"] == 2 * (P - 1) * sum(1 for n in sent if n)


@pytest.mark.parametrize("reducer", ["powersgd", "ddp"])
def test_a_one_worker_job_times_the_powersgd_hook_alone(tmp_path, reducer):
    """One worker runs no DDP and no hook on its update, but its job gives PowerSGD a twin
    (``time_hook_alone``) whose hook it times every step: t_compr, which the model adds at
    every P. DDP's hook computes nothing of its own: its t_compr stays 0."""
    rows, _, _ = job(tmp_path, reducer, P=1)
    assert len(rows) == 4 and all(r["payload_bytes"] == 0 for r in rows)
    assert all((r["t_compr"] > 0) == (reducer == "powersgd") for r in rows)
