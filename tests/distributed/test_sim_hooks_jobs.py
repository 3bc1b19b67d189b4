"""The hook baselines as training jobs: ``reducer=ddp_fp16`` and ``reducer=powersgd`` run as
P real ranks (``run_worker``, DDP with torch's hooks, gloo on loopback) and as P virtual
ranks of one process (``run_simulated``, exact mode), ResNet-20 on the 8 x 8 digits,
8 images per rank, 2 epochs of 10 steps (PowerSGD compresses from step 2), a checkpoint
after each; and a simulated PowerSGD job stopped after a checkpoint and resumed.

At P = 2 the two runs are bit-identical: the final weights, every rank's loss and record
of every step and every rank's checkpoint (weights, BN statistics, PowerSGD's error
buffers, P and Q memories, iteration and RNG). At P = 4 gloo sums in its own order
(tests/distributed/test_sim_hooks.py bounds what that does to 20 steps of a small model
without batch norm): every record (what was sent) and the first step's losses are equal;
batch norm on 8 images amplifies the rounding differences from step to step (as dense's in
tests/distributed/test_simulated.py), so the losses are compared over the first steps only:
PowerSGD's first 10 (within 1e-5), DDP-fp16's first 3 (within 1e-3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from gtopk.records.rundir import RunDir, read_jsonl
from gtopk.run.pool import WorkerGroup
from gtopk.run.spawn import spawn
from gtopk.run.world import WorkerError
from gtopk.simulated.ranks import run_simulated
from gtopk.train.loop import run_worker
from tests.config import compose_config

REDUCERS = ("ddp_fp16", "powersgd")
COMMON = [
    "mode=train",
    "data=digits",
    "data.image_size=8",
    "batch_size=8",
    "train.epochs=2",
    "train.max_iters_per_epoch=10",
    "train.loader_workers=0",
    "threads_per_worker=1",
    "logger.wandb=false",
]
FAULT = ["fault.kind=raise", "fault.rank=1", "fault.at_iter=10"]
RECORDED = ("selected", "payload_bytes", "bytes_sent", "bytes_recv", "messages_sent")

pytestmark = pytest.mark.slow


def job_config(reducer: str, P: int, cluster: str, *extra: str) -> dict:
    exact = ["cluster.batched=false"] if cluster == "simulated" else []
    cfg = compose_config([*COMMON, f"reducer={reducer}", f"nodes={P}", f"cluster={cluster}", *exact, *extra])
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"P{p}")
def runs(request, tmp_path_factory) -> tuple[int, dict[str, tuple[Path, Path]]]:
    """Both reducers at P, real and simulated: {reducer: (local dir, simulated dir)}."""
    P, root = request.param, tmp_path_factory.mktemp(f"P{request.param}")
    dirs = {r: (root / f"{r}-local", root / f"{r}-simulated") for r in REDUCERS}
    with WorkerGroup(P, timeout=300, threads=1) as group:
        for reducer, (local, _) in dirs.items():
            local.mkdir()
            group.run(run_worker, (job_config(reducer, P, "local"), str(local)), threads=1)
    with WorkerGroup(1, timeout=300, threads=1) as group:
        for reducer, (_, simulated) in dirs.items():
            simulated.mkdir()
            group.run(run_simulated, (job_config(reducer, P, "simulated"), str(simulated)), threads=1)
    return P, dirs


def rows(run: Path, rank: int) -> list[dict]:
    return read_jsonl(RunDir(run).iters(rank))


@pytest.mark.parametrize("reducer", REDUCERS)
def test_simulated_hook_jobs_train_as_real_ones(runs, reducer):
    P, dirs = runs
    local, simulated = dirs[reducer]
    a, b = (json.loads(RunDir(d).summary.read_text()) for d in (local, simulated))
    assert b["cluster"] == "simulated" and b["nodes"] == P and b["iterations"] == a["iterations"]
    for rank in range(P):
        ra, rb = rows(local, rank), rows(simulated, rank)
        assert [r["iter"] for r in ra] == [r["iter"] for r in rb] == list(range(20))
        assert [{k: r[k] for k in RECORDED} for r in ra] == [{k: r[k] for k in RECORDED} for r in rb]
        assert ra[0]["loss"] == rb[0]["loss"]
        losses = [r["loss"] for r in ra], [r["loss"] for r in rb]
        if P == 2:
            assert losses[0] == losses[1]
        elif reducer == "powersgd":  # measured: 0 to 7e-7 over the first 10 steps; up to 1e-3 by step 15
            assert losses[0][:10] == pytest.approx(losses[1][:10], rel=1e-5, abs=0)
        else:  # measured, step 1 to 4: 3e-7 to 8e-6, 3e-5 to 9e-5, 2e-4 to 9e-4, 2e-3 to 7e-3; step 8: up to 0.13
            assert losses[0][:3] == pytest.approx(losses[1][:3], rel=1e-3, abs=0)
    compressed = [r["payload_bytes"] for r in rows(simulated, 0)]
    if reducer == "powersgd":
        assert compressed[:2] == [4 * b["params"]] * 2 and all(0 < s < b["params"] for s in compressed[2:])
    if P == 2:
        assert a["weights_sha256"] == b["weights_sha256"]
        for rank in range(P):
            x, y = (torch.load(RunDir(d).checkpoint(rank), weights_only=False) for d in (local, simulated))
            assert all(torch.equal(t, y["model"][n]) for n, t in x["model"].items()), rank
            assert_same(x["reducer"], y["reducer"])


def assert_same(x, y) -> None:
    """Equal nested checkpoint contents (tensors bit for bit)."""
    if isinstance(x, torch.Tensor):
        assert torch.equal(x, y)
    elif isinstance(x, dict):
        assert x.keys() == y.keys()
        for k in x:
            assert_same(x[k], y[k])
    elif isinstance(x, list | tuple):
        assert len(x) == len(y)
        for a, b in zip(x, y):
            assert_same(a, b)
    else:
        assert x == y


def test_a_stopped_simulated_powersgd_job_resumes_bit_identically(tmp_path):
    """Virtual rank 1 raises at the first step of epoch 1, after epoch 0's checkpoint
    (every rank's PowerSGD state in it); the same job then resumes from it (a new DDP:
    one bucket in its first step) and ends with the weights and rows of a job that was
    never stopped. P = 4, 8 images per rank: ``cluster.batched=auto`` batches."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    for d in (whole, stopped):
        d.mkdir()
    cfg = job_config("powersgd", 4, "simulated", "cluster.batched=auto")
    spawn(run_simulated, 1, (cfg, str(whole)), timeout=300)
    faulty = job_config("powersgd", 4, "simulated", "cluster.batched=auto", *FAULT)
    with pytest.raises(WorkerError, match="injected fault"):
        spawn(run_simulated, 1, (faulty, str(stopped)), timeout=300)
    assert [e["epoch"] for e in read_jsonl(RunDir(stopped).epochs)] == [0]
    spawn(run_simulated, 1, (cfg, str(stopped)), timeout=300)
    a, b = (json.loads(RunDir(d).summary.read_text()) for d in (whole, stopped))
    assert a["batched"] and a["weights_sha256"] == b["weights_sha256"]
    for rank in range(4):
        keys = ("iter", "loss", *RECORDED)
        assert [{k: r[k] for k in keys} for r in rows(whole, rank)] == [
            {k: r[k] for k in keys} for r in rows(stopped, rank)
        ]
