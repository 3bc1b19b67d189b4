"""``gtopk.run.supervise.dump_stacks`` reads a rank's stack only once it is whole: a poll of
/proc reads one thread after another, so the signal can be delivered between two of them and
that poll look calm while the handler is still writing (seen under load: a job's log held
``Thread 0x... (most recent call first):\\n  File`` and nothing more). The states below are
scripted, one per poll, as /proc would show them in that race."""

from __future__ import annotations

import signal
from dataclasses import dataclass

import pytest

from gtopk.run import supervise

PARTIAL = "Thread 0x00007f (most recent call first):\n  File"
WHOLE = PARTIAL + ' "faults.py", line 40 in _hang\n  File "loop.py", line 9 in step'
CALM = (False, set())  # nothing pending, no thread blocks the signal
WRITING = (False, {"101"})  # a thread blocks it: its handler runs


@dataclass
class Rank:
    pid: int = 4242

    def is_alive(self) -> bool:
        return True


def scripted(monkeypatch, tmp_path, polls: list[tuple[tuple, str]]) -> list[str]:
    """Run ``dump_stacks`` over ``polls``: per poll, the signal state /proc shows and the
    file's text then (after the last, both stay as they are); before the signal, calm and
    nothing written. Returns every text it read, the one it reported last."""
    calls = {"n": 0, "text": ""}
    seen: list[str] = []

    def state(pid: int, sig: int):
        assert (pid, sig) == (4242, signal.SIGUSR1)
        n, calls["n"] = calls["n"], calls["n"] + 1
        if n == 0:  # the state before the signal
            return CALM
        got, calls["text"] = polls[min(n, len(polls)) - 1]
        return got

    def read(stack_dir: str, rank: int) -> str:
        seen.append(calls["text"])
        return calls["text"]

    monkeypatch.setattr(supervise, "catches", lambda pid, sig: True)
    monkeypatch.setattr(supervise, "signal_state", state)
    monkeypatch.setattr(supervise, "read_stack", read)
    monkeypatch.setattr(supervise.os, "kill", lambda pid, sig: None)
    monkeypatch.setattr(supervise.time, "sleep", lambda s: None)
    supervise.dump_stacks([Rank()], [0], str(tmp_path), bound=60.0)
    return seen


def test_a_torn_calm_poll_does_not_end_the_wait(monkeypatch, tmp_path):
    """Poll 1 is torn (calm, half a stack written), poll 2 sees the handler block the
    signal, polls 3 and 4 are calm with the whole stack: the whole stack is returned. Before
    the fix the wait ended at poll 1 and the report held the half."""
    seen = scripted(
        monkeypatch,
        tmp_path,
        [(CALM, PARTIAL), (WRITING, PARTIAL), (CALM, WHOLE), (CALM, WHOLE)],
    )
    assert seen[-1] == WHOLE


@pytest.mark.parametrize("growing", [True, False])
def test_two_calm_polls_must_read_the_same_stack(monkeypatch, tmp_path, growing):
    """Two calm polls in a row that read different texts (the file still grew between
    them) do not end the wait; the first pair that agrees does."""
    polls = [(CALM, PARTIAL), (CALM, WHOLE), (CALM, WHOLE)] if growing else [(CALM, WHOLE), (CALM, WHOLE)]
    seen = scripted(monkeypatch, tmp_path, polls)
    assert seen[-1] == WHOLE
    assert seen.count(PARTIAL) == (1 if growing else 0)


def test_stack_folders_of_launchers_that_died_are_removed(monkeypatch, tmp_path):
    """A launcher killed by SIGKILL cannot remove its stack folder; the next one removes
    the folders whose launcher is gone, and keeps those of launchers still running."""
    import os
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{supervise.STACKS}{int(gone.stdout)}-abc123"
    live = tmp_path / f"{supervise.STACKS}{os.getppid()}-def456"
    other = tmp_path / f"{supervise.STACKS}x1y2z3"  # not named by a pid: not ours to judge
    for d in (dead, live, other):
        d.mkdir()
        (d / "rank0.txt").write_text("")
    with supervise.stack_dir() as path:
        assert os.path.basename(path).startswith(f"{supervise.STACKS}{os.getpid()}-")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, os.path.basename(path)])
    assert not os.path.exists(path)
    assert live.exists() and other.exists() and not dead.exists()


def test_a_hung_ranks_line_is_the_watchdogs_message_not_its_stacks_last_frame():
    from gtopk.run.world import STACK_HEADER, WorkerError

    stack = 'Thread 0x1 (most recent call first):\n  File "/x/faults.py", line 9 in _hang\n  File "<string>", line 1 in <module>'
    err = WorkerError({0: f"no progress for 15 s (watchdog: timeout_s=15): hung{STACK_HEADER}{stack}"})
    assert err.summary() == "rank 0: no progress for 15 s (watchdog: timeout_s=15): hung"
