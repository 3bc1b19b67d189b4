"""The run folder's lock: ``job_lock`` on a filesystem without ``flock`` is one line of bad
input (exit 2), not an OSError traceback; ``torchrun_lock`` lets one torchrun world at a
time into a run folder (rank 0 takes ``job_lock``'s lock, the other ranks nothing), and
``agree_on_lock`` raises rank 0's refusal (here in a world of one; every rank of a larger
world gets the same object through the broadcast)."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from gtopk.records.rundir import LOCK
from gtopk.run.jobs import JobBusy, LockUnavailable, agree_on_lock, job_lock, torchrun_lock

ROOT = Path(__file__).resolve().parents[2]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL])
def test_a_filesystem_without_flock_is_one_line_of_bad_input(tmp_path, monkeypatch, code):
    def no_flock(fd: int, op: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    run_dir = tmp_path / "runs" / "job"
    before = open_fds()
    with pytest.raises(LockUnavailable) as info:
        with job_lock(run_dir):
            pytest.fail("the block ran without the lock")
    text = str(info.value)
    assert "\n" not in text and str(run_dir) in text and os.strerror(code) in text
    assert "hydra.sweep.dir=" in text and "hydra.run.dir=" in text and "-o flock" in text  # the fixes
    assert isinstance(info.value, JobBusy)  # gtopk.run.execute: one line on stderr, exit 2, nothing written
    assert open_fds() == before  # the lock file is not left open
    with torchrun_lock(run_dir, rank=0) as refusal:  # under torchrun: rank 0's refusal, for every rank
        assert isinstance(refusal, LockUnavailable) and str(refusal) == text


def test_another_failure_of_flock_is_not_taken_for_a_missing_lock(tmp_path, monkeypatch):
    def broken(fd: int, op: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fcntl, "flock", broken)
    with pytest.raises(OSError) as info:
        with job_lock(tmp_path):
            pass
    assert info.value.errno == errno.EIO and not isinstance(info.value, LockUnavailable)


def test_torchrun_lock_lets_one_world_at_a_time_into_a_run_folder(tmp_path):
    """Two torchrun_locks on one folder in this process (separate open files: flock is per
    open file, so they exclude each other as two processes do): the second rank 0 is
    refused while the first holds it; ranks other than 0 take nothing; released on exit."""
    with torchrun_lock(tmp_path, rank=0) as first:
        assert first is None
        with torchrun_lock(tmp_path, rank=0) as second:
            assert isinstance(second, JobBusy) and f"(pid {os.getpid()})" in str(second)
            assert "\n" not in str(second) and str(tmp_path) in str(second)
        with torchrun_lock(tmp_path, rank=1) as other:
            assert other is None
        with pytest.raises(JobBusy):  # the same lock as a spawned job's
            with job_lock(tmp_path):
                pass
    with torchrun_lock(tmp_path, rank=1):  # holds nothing: a job may run the folder meanwhile
        with job_lock(tmp_path):
            pass
    with torchrun_lock(tmp_path, rank=0) as again:
        assert again is None


def test_rank_comes_from_torchruns_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with job_lock(tmp_path), torchrun_lock(tmp_path) as refusal:
        assert refusal is None  # rank 1: not even tried
    monkeypatch.setenv("RANK", "0")
    with job_lock(tmp_path), torchrun_lock(tmp_path) as refusal:
        assert isinstance(refusal, JobBusy)


HOLD = (
    "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
    "from gtopk.run.jobs import torchrun_lock\n"
    "with torchrun_lock(Path(sys.argv[2]), rank=0) as refusal:\n"
    "    print('refused' if refusal else 'held', flush=True); sys.stdin.read()\n"
)


def test_a_second_process_is_refused_until_the_first_exits(tmp_path):
    """Another process (torchrun's rank 0 of another submission) holds the folder: this one
    is refused, naming that process; once it exits (the kernel drops its lock), this one
    gets it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(ROOT), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"  # a state, not a time: it holds the lock now
        with torchrun_lock(tmp_path, rank=0) as refusal:
            assert isinstance(refusal, JobBusy) and f"(pid {holder.pid})" in str(refusal)
        assert (tmp_path / LOCK).read_text().strip() == str(holder.pid)
    finally:
        holder.stdin.close()
        holder.wait(timeout=120)
    assert holder.returncode == 0
    with torchrun_lock(tmp_path, rank=0) as refusal:
        assert refusal is None


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_agree_on_lock_raises_rank_0s_refusal(tmp_path, world_of_one):
    with job_lock(tmp_path), torchrun_lock(tmp_path, rank=0) as refusal:
        with pytest.raises(JobBusy) as info:
            agree_on_lock(refusal)
        assert str(info.value) == str(refusal)
    with torchrun_lock(tmp_path, rank=0) as refusal:
        agree_on_lock(refusal)  # rank 0 holds the lock: every rank goes on
        assert (tmp_path / LOCK).read_text().strip() == str(os.getpid())
