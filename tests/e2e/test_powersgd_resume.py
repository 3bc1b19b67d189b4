"""A PowerSGD training job killed after a checkpoint and resumed ends with the weights of
the uninterrupted job: the hook's error buffers, P/Q memories, iteration and RNG go through
the checkpoints, and survive the new DDP's other buckets (baselines.powersgd_state)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from gtopk.records.rundir import read_jsonl
from tests.datagen import write_cifar10
from tests.procs import cifar_train, finish, run, start


@pytest.mark.slow
def test_a_killed_powersgd_job_resumes_to_the_uninterrupted_weights(tmp_path):
    """P = 2 (two ranks' sums do not depend on the order gloo adds them in, which a new
    DDP's first single-bucket pass may change at larger P). Rank 1 hangs at the first
    iteration of epoch 1, after epoch 0's checkpoint, so the job is killed mid-training."""
    data = write_cifar10(tmp_path / "data", per_batch=64)  # 10 iterations per epoch at P = 2, batch 16
    common = cifar_train(data, "powersgd")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    out = run(*common, f"hydra.run.dir={whole}")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_jsonl(whole / "iters.rank0.jsonl")
    m = json.loads((whole / "summary.json").read_text())["params"]
    assert [r["payload_bytes"] == 4 * m for r in rows[:3]] == [True, True, False]  # compressed from iteration 2
    assert all(0 < r["payload_bytes"] < m for r in rows[2:]), "PowerSGD did not compress"

    proc = start(*common, f"hydra.run.dir={cut}", "fault.kind=hang", "fault.rank=1", "fault.at_iter=10")
    deadline = time.monotonic() + 300
    while not all((cut / "checkpoint" / f"rank{r}.pt").exists() for r in (0, 1)):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    assert finish(proc).returncode == -signal.SIGKILL and not (cut / "summary.json").exists()
    out = run(*common, f"hydra.run.dir={cut}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming from the checkpoint of epoch 0" in out.stderr
    resumed = json.loads((cut / "summary.json").read_text())
    assert resumed["weights_sha256"] == json.loads((whole / "summary.json").read_text())["weights_sha256"]
