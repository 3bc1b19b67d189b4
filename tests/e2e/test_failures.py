"""Failure handling for real, through the fault settings: a rank that raises, dies or
hangs stops its job in bounded time with its traceback in the job's log; sweeps go on and
list their failed jobs; Ctrl-C cleans up and a re-run resumes; NaN gradients stop or skip;
concurrent sweeps do not collide. After every case no process of the run is left."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gtopk.records.rundir import JsonLines, read_jsonl
from gtopk.run.jobs import job_lock
from gtopk.run.spawn import WorkerError, listen, spawn
from tests.datagen import write_cifar10
from tests.procs import (
    FAST,
    ROOT,
    cifar_train,
    finish,
    listening_ports,
    run,
    session_processes,
    start,
    wait_session_empty,
)
from tests.workers import fail_on_rank1, sleep_forever


def rows(job: Path, rank: int) -> list[dict]:
    return read_jsonl(job / f"iters.rank{rank}.jsonl")


#: upper bound on how long a failed job takes to stop (spawn's grace, 5 s, and stop's
#: terminate-then-kill, 5 s, are the design; the rest is slack for a loaded 2-core machine)
STOP_S = 60
RAISED = "InjectedFault: injected fault: fault.kind=raise on rank 1 at iteration 1"
KILLED = "process exited with code -9 (SIGKILL) before reporting"


@pytest.mark.parametrize(
    "kind,text,loaders",
    [
        ("raise", RAISED, False),
        pytest.param("kill", KILLED, False, marks=pytest.mark.slow),
        ("kill", KILLED, True),
    ],
)
def test_a_rank_that_raises_or_dies_stops_the_job(tmp_path, kind, text, loaders):
    """Benchmark mode; and training with DataLoader worker processes under each rank,
    which must not outlive it either. The killed rank in benchmark mode is slow; in
    ``make test`` the killed rank with DataLoader workers checks all it checks."""
    job = tmp_path / "run"
    setup = list(FAST)
    if loaders:
        data = write_cifar10(tmp_path / "data", per_batch=48)
        setup = [
            "mode=train",
            "data=cifar10",
            f"data.root={data}",
            "data.verify=false",
            "train.epochs=1",
            "train.loader_workers=1",
            "model.batch_size.train=16",
            "logger.wandb=false",
        ]
    done = run(*setup, "nodes=3", f"fault.kind={kind}", "fault.rank=1", "fault.at_iter=1", f"hydra.run.dir={job}")
    assert done.returncode == 1, done.stderr[-3000:]
    struck = (job / "iters.rank1.jsonl").stat().st_mtime  # rank 1's last row, just before the fault
    print(f"fault.kind={kind}, loaders={loaders}: run.py exited {done.ended - struck:.1f}s after rank 1's last row")
    assert done.ended - struck < STOP_S
    assert "error: rank 1: " in done.stderr and text in done.stderr  # the one-line summary
    log = (job / "run.log").read_text()
    assert "--- rank 1 ---" in log and text in log
    failed = json.loads((job / "failed.json").read_text())
    assert failed["type"] == "WorkerError" and set(failed["failures"]) == {"0", "1", "2"}
    assert not (job / "summary.json").exists()
    assert [r["iter"] for r in rows(job, 1)] == [0]
    assert not done.left, done.left


@pytest.mark.parametrize(
    "nodes,setting,text",
    [
        (2, "collective_timeout_s=5", "Timed out waiting 5000ms"),
        pytest.param(1, "timeout_s=8", "no progress for", marks=pytest.mark.slow),
    ],
)
def test_a_hung_rank_is_caught_by_the_timeout(tmp_path, nodes, setting, text):
    """P=2: the other rank times out in the step's collective; P=1: the watchdog. Either
    way the hung rank's own stack (sleeping in the fault) is in the log. P=1 is slow; in
    ``make test``: test_watchdog_stops_a_rank_that_makes_no_progress (the watchdog, the
    hung rank's stack) and P=2 here (run.py, the stack in the job's log)."""
    job = tmp_path / "run"
    done = run(
        *FAST,
        f"nodes={nodes}",
        setting,
        "fault.kind=hang",
        f"fault.rank={nodes - 1}",
        "fault.at_iter=1",
        f"hydra.run.dir={job}",
    )
    assert done.returncode == 1, done.stderr[-3000:]
    struck = (job / f"iters.rank{nodes - 1}.jsonl").stat().st_mtime
    limit = float(setting.split("=")[1])
    print(f"{setting}: the job exited {done.ended - struck:.1f}s after the hung rank's last row")
    # not before the timeout (1 s: the other rank may enter the collective, or beat, before the hung rank
    # writes its row); then the job stops within STOP_S
    assert limit - 1 <= done.ended - struck < limit + STOP_S
    log = (job / "run.log").read_text()
    assert text in log and "in _hang" in log and "faults.py" in log
    if nodes > 1:  # the one line names the hung rank, not the one that timed out waiting for it
        assert f"rank(s) [{nodes - 1}] hung" in done.stderr, done.stderr[-2000:]
    else:  # the watchdog's own message, not the last frame of the hung rank's stack
        (error,) = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        assert text in error, done.stderr[-2000:]
    assert not done.left, done.left


@pytest.mark.slow  # in make test: a failing rank stops its job (above)
def test_a_sweep_goes_on_lists_its_unfinished_jobs_and_a_rerun_retries_them(tmp_path):
    """Of nodes=1,2,3: the P=2 job is held by another process (its lock) and the P=3 job's
    rank 2 raises; the sweep runs on, lists both, exits 1; the same command again skips
    the finished job and runs the other two."""
    args = ["-m", f"hydra.sweep.dir={tmp_path}", *FAST, "nodes=1,2,3"]
    one, two, three = (
        tmp_path / f"batch_size=4,benchmark.iters=2,benchmark.warmup=1,data.train_size=64,nodes={p}" for p in (1, 2, 3)
    )
    with job_lock(two):
        done = run(*args, "fault.kind=raise", "fault.rank=2", "fault.at_iter=1")  # only P=3 has a rank 2
    assert done.returncode == 1, done.stderr[-3000:]
    assert (one / "summary.json").exists() and not (two / "summary.json").exists()
    assert not (three / "summary.json").exists() and (three / "failed.json").exists()
    assert not (two / "failed.json").exists()  # another process's directory: nothing written
    assert "2 of 3 job(s) did not finish" in done.stderr
    assert f"{two}: {two} is being run by another process (pid {os.getpid()})" in done.stderr
    assert f"{three}: rank 2: gtopk.train.faults.InjectedFault" in done.stderr and not done.left
    again = run(*args)  # the same sweep, no fault, no lock
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipping") == 1 and "attempt 2" in again.stdout
    assert all((job / "summary.json").exists() for job in (one, two, three))
    assert not (three / "failed.json").exists()
    assert {r["attempt"] for r in rows(three, 2)} == {1, 2}
    assert [r["iter"] for r in rows(three, 2)] == [0, 0, 1, 2]  # attempt 1 got as far as iteration 0


def sweep_args(tmp_path: Path, data: Path) -> list[str]:
    """Two training jobs (topk, gtopk) of 2 epochs x 5 iterations, P = 2."""
    return ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *cifar_train(data, "topk,gtopk", "density=0.05")]


#: rank 1 of the first job hangs at its first iteration of epoch 1, after the epoch-0
#: checkpoint: the job is surely still running when the test presses Ctrl-C (fault.* is not
#: part of the job's directory name, so the re-run without it resumes the same jobs)
HANG_IN_EPOCH_1 = ["fault.kind=hang", "fault.rank=1", "fault.at_iter=5"]


def epoch_0_done(sweep: Path) -> Path | None:
    """The job directory whose epoch 0 is checkpointed by both ranks and recorded (job
    directories are nested: their names hold data.root, a path)."""
    for ckpt in sweep.rglob("checkpoint"):
        if (ckpt / "rank0.pt").exists() and (ckpt / "rank1.pt").exists() and read_jsonl(ckpt.parent / "epochs.jsonl"):
            return ckpt.parent
    return None


def start_and_wait_for_epoch_0(tmp_path: Path, args: list[str], sigint: str) -> tuple[subprocess.Popen, Path]:
    proc = start(*args, *HANG_IN_EPOCH_1, sigint=sigint)
    deadline = time.monotonic() + 300
    while not (job := epoch_0_done(tmp_path / "sweep")):
        assert proc.poll() is None and time.monotonic() < deadline, "epoch 0 was not checkpointed"
        time.sleep(0.05)
    return proc, job


@pytest.mark.slow  # in make test: workers die with their parent even on SIGKILL (below)
def test_ctrl_c_stops_every_worker_and_a_rerun_resumes(tmp_path):
    """run.py as a terminal's foreground job (SIGINT at its default, see tests.procs.start):
    Ctrl-C, while one rank waits in a collective for the other, exits 130 and leaves no
    process; re-running the same command resumes from the checkpoints."""
    args = sweep_args(tmp_path, write_cifar10(tmp_path / "data", per_batch=32))
    proc, first = start_and_wait_for_epoch_0(tmp_path, args, sigint="default")
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
    t0 = time.monotonic()
    done = finish(proc, timeout=120)
    print(f"Ctrl-C: run.py exited after {time.monotonic() - t0:.1f}s")
    assert done.returncode == 130 and "re-run the same command to resume" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not done.left, done.left
    with open(first / "iters.rank0.jsonl", "a") as f:
        f.write('{"iter": 99, "lo')  # what a crash mid-write leaves
    saved = torch.load(first / "checkpoint" / "rank0.pt", weights_only=False)["epoch"]
    epochs = (first / "epochs.jsonl").read_text().splitlines(keepends=True)
    (first / "epochs.jsonl").write_text("".join(e for e in epochs if json.loads(e)["epoch"] != saved))  # a crash
    # between saving epoch `saved` and recording it: its record comes back from the checkpoint
    again = run(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from the checkpoint of epoch" in again.stderr
    jobs = sorted(p.parent for p in (tmp_path / "sweep").rglob("summary.json"))
    assert len(jobs) == 2
    for job in jobs:
        assert [e["epoch"] for e in read_jsonl(job / "epochs.jsonl")] == [0, 1]  # none lost or repeated
        assert json.loads((job / "summary.json").read_text())["iterations"] == (2 * 5 - 2) * 2  # all epochs
    (jobs[1] / "summary.json").unlink()  # as if stopped after its last checkpoint, before its summary
    third = run(*args)
    assert third.returncode == 0 and third.stdout.count("skipping") == 1, third.stderr[-3000:]
    assert json.loads((jobs[1] / "summary.json").read_text())["iterations"] == (2 * 5 - 2) * 2
    text = (first / "iters.rank0.jsonl").read_text()
    assert '{"iter": 99, "lo\n' in text and all(r["iter"] != 99 for r in rows(first, 0))


def sigint_ignored(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT (its SigIgn mask in /proc)."""
    mask = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("SigIgn:"))
    return bool(int(mask.split()[1], 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.slow  # the SIGINT handling's other half is test_ctrl_c_stops_every_worker...
def test_a_job_started_with_sigint_ignored_ignores_ctrl_c(tmp_path):
    """As a background job of a script (``cmd &``) or under nohup: run.py and its workers
    inherit SIGINT ignored and keep ignoring it (the kernel's SigIgn mask of every process
    of the job, before and after a SIGINT). Rank 1 hangs, so the job is surely running
    throughout; SIGTERM ends it."""
    job = tmp_path / "run"
    proc = start(
        *FAST, "nodes=2", "fault.kind=hang", "fault.rank=1", "fault.at_iter=1", f"hydra.run.dir={job}", sigint="ignore"
    )
    deadline = time.monotonic() + 300
    while not rows(job, 1):  # rank 1's row of iteration 0: it hangs next, rank 0 waits for it
        assert proc.poll() is None and time.monotonic() < deadline, "rank 1 did not start"
        time.sleep(0.05)
    pids = [int(line.split()[0]) for line in session_processes(proc.pid)]
    assert len(pids) >= 3 and all(sigint_ignored(pid) for pid in pids)  # run.py and both ranks
    os.killpg(proc.pid, signal.SIGINT)
    assert all(sigint_ignored(pid) for pid in pids) and proc.poll() is None
    os.kill(proc.pid, signal.SIGTERM)
    done = finish(proc)
    assert done.returncode != 0 and "Traceback" not in done.stderr and not done.left, done.stderr[-3000:]


@pytest.mark.parametrize("policy", [pytest.param("skip", marks=pytest.mark.slow), "stop"])  # stop: the default
def test_a_nan_gradient_is_detected_on_every_rank(tmp_path, policy):
    job = tmp_path / "run"
    done = run(
        *FAST,
        "benchmark.iters=3",
        "nodes=2",
        "reducer=gtopk",
        "fault.kind=nan",
        "fault.rank=1",
        "fault.at_iter=2",
        f"nonfinite={policy}",
        f"hydra.run.dir={job}",
    )
    assert done.returncode == (0 if policy == "skip" else 1), done.stderr[-3000:]
    for rank in (0, 1):
        by_iter = {r["iter"]: r for r in rows(job, rank)}
        assert by_iter[2]["nonfinite"] == policy and by_iter[2]["nonfinite_ranks"] == [1]
        assert by_iter[1]["nonfinite"] is None and by_iter[1]["nonfinite_ranks"] == []
        assert sorted(by_iter) == ([0, 1, 2, 3] if policy == "skip" else [0, 1, 2])
    if policy == "skip":
        summary = json.loads((job / "summary.json").read_text())
        assert summary["steps_skipped_nonfinite"] == 1 and summary["iterations"] == 2 * 2
        assert summary["weights_identical_across_ranks"]
    else:
        failed = json.loads((job / "failed.json").read_text())
        assert "NonFiniteGradient" in failed["error"] and "nonfinite=skip" in failed["error"]
        assert not (job / "summary.json").exists()
    assert not done.left


@pytest.mark.slow  # ~21 s; the job lock is also exercised by the sweep-group tests in make test
def test_concurrent_sweeps_do_not_collide(tmp_path):
    """Two copies of one sweep into the same directory and a third elsewhere, at once:
    every job runs exactly once, and nothing fights over ports."""
    same = ["-m", f"hydra.sweep.dir={tmp_path / 'same'}", *FAST, "nodes=2", "reducer=dense,gtopk"]
    other = ["-m", f"hydra.sweep.dir={tmp_path / 'other'}", *FAST, "nodes=2", "reducer=dense,gtopk"]
    procs = [start(*same), start(*same), start(*other)]
    results = [finish(p, timeout=600) for p in procs]
    for done in results:
        assert done.returncode == 0 or "being run by another process" in done.stderr, done.stderr[-3000:]
        assert not done.left
    assert results[2].returncode == 0
    for sweep in ("same", "other"):
        jobs = sorted(p.parent for p in (tmp_path / sweep).glob("*/summary.json"))
        assert len(jobs) == 2  # each job of "same" was run by one copy and passed over by the other
        for job in jobs:
            assert len(read_jsonl(job / "attempts.jsonl")) == 1, job  # never run twice
            for rank in (0, 1):
                assert [r["iter"] for r in rows(job, rank)] == [0, 1, 2]
    passed_over = sum(
        d.stdout.count("skipping")
        + sum(ln.startswith("error: ") and "being run by another" in ln for ln in d.stderr.splitlines())
        for d in results[:2]
    )
    assert passed_over == 2, [d.stdout + d.stderr for d in results[:2]]


# -- the launcher itself ------------------------------------------------------------------


def test_spawn_leaves_no_process_and_frees_its_port_after_a_failure():
    with listen("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
    with pytest.raises(WorkerError) as info:
        spawn(fail_on_rank1, 3, ("kill",), port=port, timeout=60, grace=2)
    assert "SIGKILL" in info.value.failures[1] and info.value.summary().startswith("rank 1: process exited")
    assert not multiprocessing.active_children()
    assert port not in listening_ports()
    listen("127.0.0.1", port).close()  # bindable again


def test_watchdog_stops_a_rank_that_makes_no_progress():
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(sleep_forever, 1, timeout=3)
    assert "no progress for" in info.value.failures[0] and "in sleep_forever" in info.value.failures[0]
    # bounded (3 s watchdog + start-up and stop on a loaded machine), far below sleep_forever's 3600 s
    assert time.monotonic() - t0 < STOP_S and not multiprocessing.active_children()


def test_workers_die_with_their_parent_even_on_sigkill(tmp_path):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from gtopk.run.spawn import spawn; "
        "from tests.workers import sleep_forever; spawn(sleep_forever, 2, (sys.argv[2],), timeout=600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(ROOT), str(tmp_path)], start_new_session=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("rank*.pid"))) < 2:
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    parent.kill()
    parent.wait()
    assert not wait_session_empty(parent.pid)


def test_worker_error_summary_names_the_rank_that_failed_on_its_own():
    error = WorkerError(
        {
            0: "Traceback (most recent call last):\nRuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:1",
            1: 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nhydra.errors.InstantiationException: '
            "Error in call to target 'X':\nValueError('bad')\nfull_key: reducer",
            2: "stopped: still running when the group was stopped (another rank failed first)",
        }
    )
    assert error.summary() == (
        "rank 1: hydra.errors.InstantiationException: Error in call to target 'X':; "
        "rank(s) [2] still running when stopped (hung?)"
    )


def test_a_half_written_last_line_is_closed_off_and_skipped(tmp_path):
    path = tmp_path / "iters.rank0.jsonl"
    path.write_text('{"iter": 0}\n{"iter": 1, "t_')
    assert read_jsonl(path) == [{"iter": 0}]
    out = JsonLines(path)
    out.write({"iter": 1})
    out.close()
    assert read_jsonl(path) == [{"iter": 0}, {"iter": 1}]


def test_sigterm_stops_the_job_with_the_line_that_says_how_to_resume(tmp_path):
    """SIGTERM (a scheduler's stop, ``kill``) ends the job as Ctrl-C does: every worker
    stopped, exit 143, one line saying how to resume, no traceback."""
    job = tmp_path / "run"
    proc = start(*FAST, "nodes=2", "fault.kind=hang", "fault.rank=1", "fault.at_iter=1", f"hydra.run.dir={job}")
    deadline = time.monotonic() + 300
    while not (job / "iters.rank1.jsonl").exists() or not (job / "iters.rank1.jsonl").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "the job did not start stepping"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    done = finish(proc, timeout=120)
    assert done.returncode == 143, done.stderr[-3000:]
    assert "re-run the same command to resume" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr and not done.left, done.left
