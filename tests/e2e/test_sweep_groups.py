"""``run.py -m``: the jobs of one P share one group of worker processes (observed through the
``pid`` of every iteration row), every job still runs under its lock with its attempt
recorded, and a failed job ends its group without stopping the sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gtopk.records.rundir import ATTEMPTS, LOCK, read_jsonl
from tests.procs import FAST, run


def worker_pids(job: Path, nodes: int) -> tuple[int, ...]:
    """The pid of each rank of ``job`` (each rank's rows all name one process)."""
    pids = []
    for rank in range(nodes):
        seen = {r["pid"] for r in read_jsonl(job / f"iters.rank{rank}.jsonl")}
        assert len(seen) == 1, (job, rank, seen)
        pids.append(seen.pop())
    return tuple(pids)


@pytest.mark.slow  # in make test: test_workergroup's runner_reuses_the_live_group_only_for_the_same_spec
def test_jobs_of_one_p_share_a_group_and_each_keeps_its_lock_and_attempts(tmp_path):
    done = run("-m", f"hydra.sweep.dir={tmp_path}", *FAST, "nodes=1,2", "reducer=dense,gtopk")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not done.left, done.left
    jobs = {
        (p, r): tmp_path / f"batch_size=4,benchmark.iters=2,benchmark.warmup=1,data.train_size=64,nodes={p},reducer={r}"
        for p in (1, 2)
        for r in ("dense", "gtopk")
    }
    groups = {p: {worker_pids(jobs[p, r], p) for r in ("dense", "gtopk")} for p in (1, 2)}
    assert all(len(g) == 1 for g in groups.values()), groups  # both jobs of a P: the same processes
    assert not set(groups[1].pop()) & set(groups[2].pop())  # two groups in all, not four
    for job in jobs.values():
        assert (job / "summary.json").exists() and (job / LOCK).exists()
        attempts = read_jsonl(job / ATTEMPTS)
        assert [a["attempt"] for a in attempts] == [1] and attempts[0]["pid"] != worker_pids(job, 1)[0]


@pytest.mark.slow  # in make test: test_workergroup's runner_closes_its_group_after_a_failure (same path, no run.py)
def test_a_failed_job_ends_its_group_and_the_next_job_of_that_p_starts_a_fresh_one(tmp_path):
    """Three jobs at P = 2 (benchmark.iters 2, 5, 3): rank 1 raises at iteration 4, which
    only the middle job reaches."""
    done = run(
        "-m",
        f"hydra.sweep.dir={tmp_path}",
        *FAST,
        "nodes=2",
        "benchmark.iters=2,5,3",
        "fault.kind=raise",
        "fault.rank=1",
        "fault.at_iter=4",
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "1 of 3 job(s) did not finish" in done.stderr and not done.left, done.left
    first, failed, last = (
        tmp_path / f"batch_size=4,benchmark.iters={n},benchmark.warmup=1,data.train_size=64,nodes=2" for n in (2, 5, 3)
    )
    assert (first / "summary.json").exists() and (last / "summary.json").exists()
    assert json.loads((failed / "failed.json").read_text())["type"] == "WorkerError"
    assert worker_pids(failed, 2) == worker_pids(first, 2)  # it ran in the first job's group
    assert not set(worker_pids(last, 2)) & set(worker_pids(first, 2))  # which then ended
    assert [r["iter"] for r in read_jsonl(failed / "iters.rank1.jsonl")] == [0, 1, 2, 3]
