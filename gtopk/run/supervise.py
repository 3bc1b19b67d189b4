"""Watching the worker processes of one ``spawn``: collect their results, notice the
ones that die or stop making progress (the heartbeat watchdog), ask the running ones for
their Python stacks, and stop them all. Parent side only; nothing here is collective."""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def supervise(
    procs: list,
    results: Any,
    beats: Any,
    timeout: float,
    grace: float,
    outputs: dict[int, Any],
    failures: dict[int, str],
) -> set[int]:
    """Collect results until every rank reported, or ``grace`` after the first failure.
    A rank that died without reporting, or made no progress for ``timeout``, failed;
    returns the latter (hung) ranks."""
    first: float | None = None
    gone: dict[int, float] = {}
    hung: set[int] = set()
    while len(outputs) + len(failures) < len(procs):
        if first is not None and time.monotonic() > first + grace:
            break
        try:
            rank, ok, payload = results.get(timeout=0.1)
            if ok:
                outputs[rank] = pickle.loads(payload)
            else:
                failures[rank] = payload
        except queue.Empty:
            pass
        now = time.monotonic()
        for r, p in enumerate(procs):
            if r in outputs or r in failures:
                continue
            if p.is_alive():
                if now - beats[r] > timeout:
                    failures[r] = f"no progress for {now - beats[r]:.0f}s (watchdog timeout {timeout:g}s): hung?"
                    hung.add(r)
            elif p.exitcode != 0:
                failures[r] = f"process exited with {exit_reason(p.exitcode)} before reporting"
            elif now - gone.setdefault(r, now) > 2.0:  # its result would have arrived by now
                failures[r] = "process exited (code 0) without reporting a result"
        if failures and first is None:
            first = now
    return hung


def exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"code {code}"


#: the prefix of a stack folder; the launcher's pid follows it, then tempfile's suffix
STACKS = "gtopk-stacks-"


@contextlib.contextmanager
def stack_dir() -> Iterator[str]:
    """A folder for the ranks' stack files, removed on exit. Its name holds this process's
    pid, and the folders of launchers that no longer run (killed before they could remove
    theirs: SIGKILL, the OOM killer) are removed first."""
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{STACKS}*-*"):
        pid = old.name[len(STACKS) :].partition("-")[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"{STACKS}{os.getpid()}-") as path:
        yield path


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (also one of another user's; a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (a child not reaped yet) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def read_stack(stack_dir: str, rank: int) -> str:
    try:
        return (Path(stack_dir) / f"rank{rank}.txt").read_text().strip()
    except OSError:
        return ""


def signal_state(pid: int, sig: int) -> tuple[bool, set[str]] | None:
    """``(pending, blocking)`` of ``sig`` in process ``pid``, from /proc: whether it waits
    for delivery (to the process or one of its threads), and the threads that block it;
    None where /proc cannot tell."""
    bit = 1 << (sig - 1)
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    pending, blocking = False, set()
    for task in tasks:
        try:
            status = Path(f"/proc/{pid}/task/{task}/status").read_text()
        except OSError:
            continue  # the thread ended
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key in ("SigPnd", "ShdPnd", "SigBlk") and int(value.strip() or "0", 16) & bit:
                pending |= key != "SigBlk"
                if key == "SigBlk":
                    blocking.add(task)
    return pending, blocking


def catches(pid: int, sig: int) -> bool | None:
    """Whether process ``pid`` has a handler for ``sig`` yet (a rank registers faulthandler's
    after its imports; before that SIGUSR1 would kill it); None where /proc cannot tell."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    caught = next((line.split(":")[1] for line in status.splitlines() if line.startswith("SigCgt:")), None)
    return None if caught is None else bool(int(caught.strip(), 16) & (1 << (sig - 1)))


def dump_stacks(procs: list, ranks: list[int], stack_dir: str, bound: float = 60.0) -> dict[int, str]:
    """Ask the running ``ranks`` for their Python stacks (SIGUSR1 -> faulthandler) and wait
    until each has written its stack: the signal delivered and its handler returned (the
    kernel blocks a signal in the thread running its handler, and faulthandler installs it
    without SA_NODEFER, so a thread that blocks it now but did not before is still writing),
    or the rank gone. Where /proc cannot tell, until the stack file is not empty. A rank
    that has no handler yet (still starting) is not asked. ``bound``
    only ends a wait for a rank that never handles the signal: a loaded machine makes the
    wait longer, never the stack shorter.

    A poll reads one thread's state after another, so the signal can be delivered between
    two of them and one poll look calm while a thread writes: a rank is done after two
    consecutive calm polls that read the same, non-empty stack (the second poll starts after
    the delivery, and would see the writing thread block the signal)."""
    ranks = [r for r in ranks if catches(procs[r].pid, signal.SIGUSR1) is not False]  # else it would die of it
    before = {r: signal_state(procs[r].pid, signal.SIGUSR1) for r in ranks}
    for r in ranks:
        with contextlib.suppress(OSError):
            os.kill(procs[r].pid, signal.SIGUSR1)
    deadline = time.monotonic() + bound
    waiting = set(ranks)
    calm: dict[int, str] = {}  # the stack a rank's last poll read while it looked calm
    while waiting and time.monotonic() < deadline:
        for r in sorted(waiting):
            if not procs[r].is_alive():
                waiting.discard(r)
                continue
            now, then = signal_state(procs[r].pid, signal.SIGUSR1), before[r]
            busy = now is not None and then is not None and (now[0] or bool(now[1] - then[1]))
            text = "" if busy else read_stack(stack_dir, r)
            if text and calm.get(r) == text:
                waiting.discard(r)
            else:
                calm[r] = text
        if waiting:
            time.sleep(0.02)
    return {r: text for r in ranks if (text := read_stack(stack_dir, r))}


def stop(procs: list) -> None:
    """Terminate, then kill, every worker still running; reap them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


@contextlib.contextmanager
def signals_stop() -> Iterator[None]:
    """In the main thread, SIGTERM and SIGHUP raise SystemExit(128 + signal), so that
    ``spawn`` stops its workers before the process exits and the job says how to resume
    (Ctrl-C already raises); one the process ignores (SIGHUP under nohup) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    # a signal the process ignores (SIGHUP under nohup) stays ignored
    caught = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is not signal.SIG_IGN]
    old = {s: signal.signal(s, raise_exit) for s in caught}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
