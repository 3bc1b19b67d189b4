"""A simulated training job (``run.py cluster=simulated mode=train``) SIGKILLed at badly timed
moments resumes each time with at most the epoch in progress lost, and ends with every
epoch recorded exactly once (checkpoint generations: ``gtopk.train.checkpoint``).

The kill between two ranks' checkpoint files is made deterministic by the test-only hook
``GTOPK_TEST_KILL_AFTER_CHECKPOINT=<epoch>:<rank>`` (the worker SIGKILLs itself right after
writing that file); the other kills wait for a state of the run directory (this attempt's
N-th row, a rank's checkpoint file of an epoch) and SIGKILL the whole session. Every wait
polls with a deadline; nothing waits for a fixed time. One single kill between two ranks'
files runs in ``make test``; the ten kills and the distributed case (``cluster=local``,
P = 2) are slow."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from gtopk.records.rundir import RunDir, read_jsonl
from gtopk.train.checkpoint import KILL_HOOK, saved_generation
from tests.procs import Done, finish, simulated_train, start
from tests.procs import run as run_py

P, PER_EPOCH = 3, 2  # ranks; steps per epoch (simulated_train's train.max_iters_per_epoch)
DEADLINE_S = 240  # per wait: generous for a loaded 2-core machine


def train(epochs: int, run_dir: Path) -> list[str]:
    return [*simulated_train(P, epochs), f"hydra.run.dir={run_dir}"]


def resumed_from(done: Done) -> int:
    """The epoch whose checkpoint the run resumed from (-1: it started afresh)."""
    found = re.findall(r"resuming from the checkpoint of epoch (\d+)", done.stderr)
    return int(found[-1]) if found else -1


def rows(run: RunDir, attempt: int) -> list[dict]:
    """Rank 0's rows of attempt ``attempt``."""
    return [r for r in read_jsonl(run.iters(0)) if r.get("attempt") == attempt]


def wait_for(proc, what: str, ready) -> None:
    """Poll until ``ready()``; fail if the job ends first or the deadline passes."""
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert proc.poll() is None, f"the job ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S}s"
        time.sleep(0.02)


def next_epoch(run: RunDir) -> int:
    gen = saved_generation(run.path)
    return 0 if gen is None else gen["epoch"] + 1


def kill_between_ranks(args: list[str], run: RunDir, epoch: int, rank: int, monkeypatch) -> Done:
    """Run the job with the hook: the worker dies right after rank ``rank``'s file of epoch
    ``epoch``; check that it left that generation incomplete."""
    monkeypatch.setenv(KILL_HOOK, f"{epoch}:{rank}")
    proc = start(*args)
    monkeypatch.delenv(KILL_HOOK)
    done = finish(proc)
    assert done.returncode == 1 and "SIGKILL" in done.stderr, done.stderr[-3000:]
    assert run.checkpoint(rank, epoch).exists() and not run.checkpoint(rank + 1, epoch).exists()
    assert not run.checkpoint_manifest(epoch).exists()
    assert next_epoch(run) == epoch  # the generation before is the newest complete one
    return done


def check_finished(run: RunDir, epochs: int, done: Done) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    assert run.summary.exists() and not done.left
    assert [e["epoch"] for e in read_jsonl(run.epochs)] == list(range(epochs))  # each once, in order
    latest = {r["iter"]: r for r in read_jsonl(run.iters(0))}
    assert sorted(latest) == list(range(epochs * PER_EPOCH))
    assert sorted(int(p.name[5:]) for p in run.checkpoints.glob("epoch*")) == [epochs - 2, epochs - 1]


@pytest.mark.slow  # in make test: tests/unit/test_checkpoints.py (generations, a rank's file missing)
def test_a_kill_between_two_ranks_files_costs_one_epoch(tmp_path, monkeypatch):
    """The worker dies after rank 0's file of epoch 1 (ranks 1 and 2 not written): the
    same command resumes from epoch 0's generation and finishes."""
    run, epochs = RunDir(tmp_path / "run"), 3
    args = train(epochs, run.path)
    kill_between_ranks(args, run, 1, 0, monkeypatch)
    assert [e["epoch"] for e in read_jsonl(run.epochs)] == [0]
    done = run_py(*args)
    assert resumed_from(done) == 0
    check_finished(run, epochs, done)


@pytest.mark.slow  # ~90 s: twelve run.py starts
def test_ten_kills_at_random_moments_each_cost_at_most_one_epoch(tmp_path, monkeypatch):
    """Ten SIGKILLs (seeded): at this attempt's n-th row, at a rank's checkpoint file, or
    (twice) between two ranks' files by the hook; each re-run resumes from at most one epoch
    before the one in progress and never before a recorded epoch. The job then finishes
    with every epoch recorded once and the weights of a job never killed."""
    rng = random.Random(20240531)
    run, epochs = RunDir(tmp_path / "run"), 24
    args = train(epochs, run.path)
    hooked = set(rng.sample(range(10), 2))
    before: tuple[int, int] | None = None  # (newest recorded epoch, epoch in progress) at the last kill
    for attempt in range(1, 11):
        start_epoch = next_epoch(run)
        assert start_epoch < epochs - 1, "the job ran out of epochs to kill in"
        if attempt - 1 in hooked:
            done = kill_between_ranks(args, run, start_epoch, rng.randrange(P - 1), monkeypatch)
        else:
            proc = start(*args)
            n = rng.randint(1, 2 * PER_EPOCH) if rng.random() < 0.5 else 1
            wait_for(proc, f"row {n} of the attempt", lambda a=attempt, n=n: len(rows(run, a)) >= n)
            if n == 1:  # then a rank's file of this epoch or the next
                path = run.checkpoint(rng.randrange(P), min(start_epoch + rng.randint(0, 1), epochs - 1))
                wait_for(proc, str(path.relative_to(run.path)), path.exists)
            os.killpg(proc.pid, signal.SIGKILL)
            done = finish(proc)
            assert done.returncode == -signal.SIGKILL and not done.left, done.stderr[-3000:]
        check_resume(done, before)
        recorded = [e["epoch"] for e in read_jsonl(run.epochs)]
        in_progress = max((r["epoch"] for r in rows(run, attempt)), default=start_epoch)
        before = (max(recorded, default=-1), in_progress)
        assert recorded == list(range(len(recorded)))  # never an epoch twice
        assert next_epoch(run) >= in_progress  # what is on disk loses at most the epoch in progress
    done = run_py(*args)
    check_resume(done, before)
    check_finished(run, epochs, done)
    whole = run_py(*train(epochs, tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    a, b = (json.loads(RunDir(d).summary.read_text()) for d in (run.path, tmp_path / "whole"))
    assert a["weights_sha256"] == b["weights_sha256"]


def check_resume(done: Done, before: tuple[int, int] | None) -> None:
    """The run resumed from no earlier than the newest recorded epoch and one before the
    epoch in progress at the previous kill."""
    if before is None:
        assert resumed_from(done) == -1
        return
    recorded, in_progress = before
    assert resumed_from(done) >= max(recorded, in_progress - 1), (resumed_from(done), before)


@pytest.mark.slow  # ~30 s; the distributed Checkpoints in make test: tests/unit/test_checkpoints.py
def test_a_distributed_rank_killed_after_its_file_costs_one_epoch(tmp_path, monkeypatch):
    """P = 2 real ranks (``cluster=local``): rank 1 dies right after writing its file of
    epoch 1, so rank 0's manifest never comes; the re-run resumes from epoch 0's generation."""
    run, epochs = RunDir(tmp_path / "run"), 3
    args = [a for a in train(epochs, run.path) if a not in ("cluster=simulated", f"nodes={P}")]
    args += ["nodes=2", "train.loader_workers=0"]
    monkeypatch.setenv(KILL_HOOK, "1:1")
    proc = start(*args)
    monkeypatch.delenv(KILL_HOOK)
    done = finish(proc)
    assert done.returncode == 1 and "SIGKILL" in done.stderr, done.stderr[-3000:]
    assert run.checkpoint(1, 1).exists() and not run.checkpoint_manifest(1).exists() and next_epoch(run) == 1
    again = run_py(*args)
    assert resumed_from(again) == 0
    assert again.returncode == 0, again.stderr[-3000:]
    assert [e["epoch"] for e in read_jsonl(run.epochs)] == list(range(epochs))
    assert sorted(int(p.name[5:]) for p in run.checkpoints.glob("epoch*")) == [epochs - 2, epochs - 1]
