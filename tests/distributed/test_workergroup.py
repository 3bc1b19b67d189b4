"""gtopk.run.pool.WorkerGroup (P processes started once, running tasks one after another)
and gtopk.run.dispatch (at most one live group, reused for the same spec)."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from gtopk.run import dispatch
from gtopk.run.dispatch import GroupSpec, run_on_cluster
from gtopk.run.pool import WorkerGroup
from gtopk.run.spawn import WorkerError
from tests.workers import fail_on_rank1, pid_and_threads, sleep_forever

LOCAL = json.dumps({"_target_": "gtopk.run.cluster.LocalCluster"})


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_one_group_runs_several_tasks_in_the_same_processes():
    with WorkerGroup(3, timeout=120) as group:
        first = group.run(pid_and_threads, ("a",))
        pids = [r["pid"] for r in first]
        assert len(set(pids)) == 3 and pids == group.pids
        assert all(r["pids"] == pids for r in first)  # one process group: every rank sees the same world
        for tag in ("b", "c"):
            again = group.run(pid_and_threads, (tag,))
            assert [r["pid"] for r in again] == pids and {r["tag"] for r in again} == {tag}
    assert not any(alive(pid) for pid in pids) and not multiprocessing.active_children()


def test_each_task_gets_its_own_thread_count():
    with WorkerGroup(2, timeout=120) as group:
        default = group.run(pid_and_threads)
        assert {r["threads"] for r in default} == {max(1, (os.cpu_count() or 1) // 2)}  # cores / P
        for threads in (3, 1):
            assert {r["threads"] for r in group.run(pid_and_threads, threads=threads)} == {threads}


def test_a_failing_task_stops_every_process_and_a_new_group_works():
    group = WorkerGroup(3, timeout=120, grace=2)
    pids = group.pids
    assert len(group.run(pid_and_threads)) == 3
    with pytest.raises(WorkerError) as info:
        group.run(fail_on_rank1, ("raise",))
    assert info.value.summary() == "rank 1: RuntimeError: injected failure on rank 1"
    assert set(info.value.failures) == {0, 1, 2}
    assert not any(alive(pid) for pid in pids) and not multiprocessing.active_children()
    with pytest.raises(RuntimeError, match="closed"):
        group.run(pid_and_threads)
    with WorkerGroup(3, timeout=120) as fresh:
        out = fresh.run(pid_and_threads)
    assert len(out) == 3 and not set(r["pid"] for r in out) & set(pids)


def test_the_watchdog_timeout_is_per_task():
    """A group started with a long timeout; one task's own short one catches its hang."""
    with WorkerGroup(2, timeout=300) as group:
        group.run(pid_and_threads)
        with pytest.raises(WorkerError) as info:
            group.run(sleep_forever, timeout=3)
    assert "no progress for" in info.value.failures[0] and "in sleep_forever" in info.value.failures[0]
    assert not multiprocessing.active_children()


def test_runner_reuses_the_live_group_only_for_the_same_spec():
    spec = GroupSpec(2, "gloo", 1, "cpu", LOCAL)
    try:
        a = run_on_cluster(spec, pid_and_threads, (), timeout=120, keep=True)
        b = run_on_cluster(spec, pid_and_threads, (), timeout=120, keep=True)
        assert [r["pid"] for r in a] == [r["pid"] for r in b]
        other = GroupSpec(2, "gloo", 2, "cpu", LOCAL)  # another thread count: another group
        c = run_on_cluster(other, pid_and_threads, (), timeout=120, keep=False)
        assert {r["threads"] for r in c} == {2} and not {r["pid"] for r in c} & {r["pid"] for r in a}
        assert not any(alive(r["pid"]) for r in a + c)  # the first replaced, the second not kept
        assert not multiprocessing.active_children()
    finally:
        dispatch.close()


def test_runner_closes_its_group_after_a_failure():
    spec = GroupSpec(3, "gloo", 1, "cpu", LOCAL)
    try:
        before = run_on_cluster(spec, pid_and_threads, (), timeout=120, keep=True)
        with pytest.raises(WorkerError):
            run_on_cluster(spec, fail_on_rank1, ("kill",), timeout=120, keep=True)
        assert not any(alive(r["pid"]) for r in before)
        after = run_on_cluster(spec, pid_and_threads, (), timeout=120, keep=True)
        assert not {r["pid"] for r in after} & {r["pid"] for r in before}
    finally:
        dispatch.close()
    assert not multiprocessing.active_children()


def test_stacks_are_awaited_until_written_however_late_the_rank_runs(tmp_path):
    """A rank that is not scheduled for a while (here: stopped) still gets its stack into the
    report: dump_stacks waits for the state (signal handled, file written), not for a clock."""
    import signal
    import threading
    import time

    from gtopk.run.supervise import dump_stacks, signal_state
    from tests.workers import waits_for_a_stack_request

    proc = multiprocessing.get_context("spawn").Process(
        target=waits_for_a_stack_request, args=(str(tmp_path / "rank0.txt"), str(tmp_path / "ready"))
    )
    proc.start()
    try:
        deadline = time.monotonic() + 120  # failure bound only
        while not (tmp_path / "ready").exists():
            assert proc.is_alive() and time.monotonic() < deadline, "the process did not start"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGSTOP)  # as if the machine gave it no CPU
        stat = Path(f"/proc/{proc.pid}/stat")
        while stat.read_text().rpartition(")")[2].split()[0] != "T":  # it takes effect when the process next runs
            assert time.monotonic() < deadline, "the process did not stop"
            time.sleep(0.02)
        got: dict = {}
        thread = threading.Thread(target=lambda: got.update(dump_stacks([proc], [0], str(tmp_path))))
        thread.start()
        while not signal_state(proc.pid, signal.SIGUSR1)[0]:  # the request is pending
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.02)
        thread.join(1.5)  # longer than the fixed wait this replaced
        assert thread.is_alive(), "dump_stacks gave up before the rank could write its stack"
        os.kill(proc.pid, signal.SIGCONT)
        thread.join(120)
        assert "in waits_for_a_stack_request" in got[0]
    finally:
        proc.kill()
        proc.join()
