"""``run.py cluster=simulated`` as a user runs it: what cannot run there is refused with one
line before any process starts, and a job stopped after a checkpoint resumes to the very
weights of an uninterrupted one (at 8 images per rank ``cluster.batched=auto`` runs the
batched mode: its per-rank BN statistics and RNG states resume as the exact mode's do).
(Simulated against distributed runs: tests/distributed/test_simulated.py.)"""

from __future__ import annotations

import json

import pytest

from gtopk.records.rundir import RunDir, read_jsonl
from tests.procs import one_line_error, run, simulated_train

TRAIN = simulated_train()


@pytest.mark.parametrize(
    "args,says",
    [
        # in make test through gtopk.run.execute.validate (test_bad_input); here the CLI path too
        pytest.param(["cluster=simulated", "nodes=4"], "mode=benchmark with cluster=simulated", marks=pytest.mark.slow),
        pytest.param(
            ["cluster=simulated", "nodes=2", "mode=train", "reducer=ddp", "data=digits"],
            "reducer=ddp cannot run",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["benchmark", "ddp"],
)
def test_what_cannot_run_simulated_is_refused_in_one_line(tmp_path, args, says):
    done = run(*args, f"hydra.run.dir={tmp_path / 'run'}", timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    line = one_line_error(done.stderr)
    assert says in line and ("cluster=local" in line), line
    assert not list(tmp_path.glob("run/iters.rank*.jsonl")) and not done.left


@pytest.mark.slow  # 22 s; resuming from checkpoints is in make test for real ranks (test_failures)
def test_a_stopped_simulated_job_resumes_bit_identically(tmp_path):
    """Virtual rank 1 raises at the first step of epoch 1 (after epoch 0's checkpoint);
    the same command then resumes from the per-rank checkpoints (weights, BN statistics,
    residuals, RNG states) and ends with the weights of a run that was never stopped."""
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    failed = run(*TRAIN, f"hydra.run.dir={stopped}", "fault.kind=raise", "fault.rank=1", "fault.at_iter=2")
    assert failed.returncode == 1 and "injected fault" in failed.stderr, failed.stderr[-2000:]
    assert [e["epoch"] for e in read_jsonl(RunDir(stopped).epochs)] == [0]
    assert all(RunDir(stopped).checkpoint(r).exists() for r in range(3))
    resumed = run(*TRAIN, f"hydra.run.dir={stopped}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from the checkpoint of epoch 0" in resumed.stderr
    done = run(*TRAIN, f"hydra.run.dir={whole}")
    assert done.returncode == 0, done.stderr[-2000:]
    a, b = (json.loads(RunDir(d).summary.read_text()) for d in (stopped, whole))
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["batched"] and b["batched"]  # cluster.batched=auto at 8 images per rank
    assert a["iterations"] == b["iterations"] == 3 * 2  # 3 ranks x the 2 iterations after the 2 of warm-up
    assert [e["epoch"] for e in read_jsonl(RunDir(stopped).epochs)] == [0, 1]
    for rank in range(3):  # the resumed epoch's rows are the uninterrupted run's
        rows = [r for r in read_jsonl(RunDir(stopped).iters(rank)) if r["attempt"] == 2]
        want = [r for r in read_jsonl(RunDir(whole).iters(rank)) if r["epoch"] == 1]
        assert [(r["iter"], r["loss"]) for r in rows] == [(r["iter"], r["loss"]) for r in want]
    assert not (failed.left or resumed.left or done.left)
