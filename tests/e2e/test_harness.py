"""run.py jobs as a user runs them (subprocesses): a benchmark sweep, training on the
CIFAR-10 format, a SIGKILLed training resumed, a torchrun world. Each leaves complete
records. (Config composition and data formats: tests/unit.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gtopk.records.rundir import read_jsonl
from tests.datagen import write_cifar10
from tests.procs import ROOT, cifar_train, finish, run, start


@pytest.mark.slow
def test_benchmark_sweep_end_to_end_and_rerun_skips(tmp_path):
    """Every reducer (dense, Top-k, gTop-k, DDP) at P = 1 and 3, and every summary field.
    Slow (8 jobs); in ``make test``: tests/e2e/test_failures.py::test_concurrent_sweeps_do_not_collide
    (benchmark sweeps of dense and gTop-k at P = 2, every rank's rows),
    test_a_sweep_goes_on_lists_its_unfinished_jobs_and_a_rerun_retries_them (a re-run skips
    finished jobs), tests/distributed/test_ddp_timing.py (a DDP job), test_a_nan_gradient_is_detected_on_every_rank
    (summary: iterations, weights identical across ranks)."""
    args = [
        "-m",
        f"hydra.sweep.dir={tmp_path}",
        "reducer=dense,topk,gtopk,ddp",
        "nodes=1,3",
        "batch_size=4",
        "benchmark.warmup=1",
        "benchmark.iters=2",
        "data.train_size=64",
        "logger.wandb=false",
        "density=0.01",
    ]
    out = run(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p.parent for p in tmp_path.glob("*/summary.json"))
    assert len(jobs) == 8
    for job in jobs:
        s = json.loads((job / "summary.json").read_text())
        P = s["nodes"]
        assert s["params"] == 269_722 and s["density"] == 0.01 and s["mode"] == "benchmark"
        assert s["weights_identical_across_ranks"] and s["iterations"] == 2 * P
        for key in ("t_compute", "t_compr", "t_commu", "t_iter", "images_per_s_per_worker"):
            assert s[key] >= 0, key
        assert s["images_per_s_per_worker"] == pytest.approx(4 / s["t_iter"])
        assert (s["bytes_sent_per_iter"] > 0) == (P > 1)
        assert s["env"]["torch"] == torch.__version__ and s["env"]["device"] == "cpu"
        assert (job / "config.yaml").exists()
        for r in range(P):
            rows = read_jsonl(job / f"iters.rank{r}.jsonl")
            assert [row["iter"] for row in rows] == [0, 1, 2] and rows[0]["warmup"]
    again = run(*args)
    assert again.returncode == 0 and again.stdout.count("skipping") == 8
    assert not out.left and not again.left, out.left + again.left


def test_train_on_cifar_format_lowers_the_loss(tmp_path):
    data = write_cifar10(tmp_path / "data", per_batch=128)
    out = run(
        "mode=train",
        "nodes=2",
        "reducer=gtopk",
        "density=0.05",
        "data=cifar10",
        f"data.root={data}",
        "data.verify=false",
        "train.epochs=1",
        "train.loader_workers=0",
        "model.batch_size.train=16",
        "model.lr_warmup_epochs=0",
        "model.lr=0.05",
        "logger.wandb=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_jsonl(tmp_path / "run" / "iters.rank0.jsonl")
    losses = [r["loss"] for r in rows]
    assert len(losses) == 5 * 128 // 2 // 16
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4
    epochs = read_jsonl(tmp_path / "run" / "epochs.jsonl")
    assert [e["epoch"] for e in epochs] == [0] and 0 <= epochs[0]["test_top1"] <= 1
    assert rows[0]["density"] == 0.004  # density warm-up in epoch 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    applied = sum(r["update_nnz"] for r in rows) / summary["params"]  # coverage: update_nnz / m summed
    assert 0 < applied < len(rows) and epochs[0]["coverage"] == pytest.approx(applied)
    assert summary["coverage"] == pytest.approx(applied) and summary["top1_still_rising"] is None  # 1 epoch


@pytest.mark.slow
def test_interrupted_training_resumes_from_its_checkpoint(tmp_path):
    """SIGKILL (no clean-up at all) after epoch 0's checkpoint; the same command resumes.
    Rank 1 hangs at its first iteration of epoch 1 (fault.*, not part of the job's
    identity), so the job is surely still running when it is killed. Slow; in ``make test``:
    tests/e2e/test_failures.py::test_ctrl_c_stops_every_worker_and_a_rerun_resumes (resume
    from the checkpoints after an interruption, and after a crash between saving an epoch
    and recording it)."""
    data = write_cifar10(tmp_path / "data", per_batch=64)  # 10 iterations per epoch
    args = [*cifar_train(data, "topk", "density=0.05"), f"hydra.run.dir={tmp_path / 'run'}"]
    proc = start(*args, "fault.kind=hang", "fault.rank=1", "fault.at_iter=10")
    ckpt = tmp_path / "run" / "checkpoint"
    deadline = time.monotonic() + 300
    while not ((ckpt / "rank0.pt").exists() and (ckpt / "rank1.pt").exists()):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    killed = finish(proc)
    assert killed.returncode == -signal.SIGKILL and not killed.left, killed.left
    assert not (tmp_path / "run" / "summary.json").exists()
    done_before = [e["epoch"] for e in read_jsonl(tmp_path / "run" / "epochs.jsonl")]
    out = run(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    epochs = [e["epoch"] for e in read_jsonl(tmp_path / "run" / "epochs.jsonl")]
    assert epochs == [0, 1], (done_before, epochs)  # nothing lost, nothing repeated
    assert "resuming from the checkpoint of epoch 0" in out.stderr
    latest = {r["iter"]: r for r in read_jsonl(tmp_path / "run" / "iters.rank0.jsonl")}  # last attempt's
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["coverage"] == pytest.approx(sum(r["update_nnz"] for r in latest.values()) / summary["params"])
    assert (tmp_path / "run" / "summary.json").exists() and not out.left


def test_torchrun_world_is_joined_not_spawned(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(ROOT / "run.py"),
            "nodes=2",
            "batch_size=4",
            "benchmark.iters=2",
            "logger.wandb=false",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["nodes"] == 2 and s["iterations"] == 4
    assert (tmp_path / "iters.rank1.jsonl").exists()
