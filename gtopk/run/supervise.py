"""Watching the worker processes of one ``spawn``: collect their results, notice the
ones that die or stop making progress (the heartbeat watchdog), ask the running ones for
their Python stacks, and stop them all. Parent side only; nothing here is collective."""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
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


def read_stack(stack_dir: str, rank: int) -> str:
    try:
        return (Path(stack_dir) / f"rank{rank}.txt").read_text().strip()
    except OSError:
        return ""


def dump_stacks(procs: list, ranks: list[int], stack_dir: str, wait: float = 1.0) -> dict[int, str]:
    """Ask the running ``ranks`` for their Python stacks (SIGUSR1 -> faulthandler)."""
    for r in ranks:
        with contextlib.suppress(OSError):
            os.kill(procs[r].pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait
    stacks: dict[int, str] = {}
    while time.monotonic() < deadline and len(stacks) < len(ranks):
        time.sleep(0.05)
        stacks = {r: text for r in ranks if (text := read_stack(stack_dir, r))}
    return stacks


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
    ``spawn`` stops its workers before the process exits (Ctrl-C already raises)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, raise_exit) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
