"""Cooperative ranks: P threads in one process that run one at a time, in a deterministic
order, each until it waits on something (``_block``) or finishes; a rank another one unblocks
is queued again (``_wake``). If every unfinished rank waits on something no rank will do,
``run`` raises ``Deadlock`` naming them; a rank's exception fails ``run`` (the other ranks
unwind). The scheduling alone: what the ranks wait for and what they record is the subclass's
(``gtopk.perf.virtualworld.RecordedWorld``), as is ``patched``, the context ``run`` holds while
the ranks run. Nothing here is collective: ``torch.distributed`` is not touched.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any


class Deadlock(RuntimeError):
    """Every unfinished rank waits on a message or collective no other rank will complete."""


class _Aborted(BaseException):
    """Unwinds a blocked rank's thread after another rank failed or the world deadlocked."""


class CooperativeRanks:
    """P ranks, each a thread of its own, run cooperatively: ``run(fn)`` calls ``fn(rank)``
    on every rank and returns the P results; ``rank`` is the calling thread's rank."""

    def __init__(self, P: int, stack_kib: int = 512):
        if P < 1:
            raise ValueError(f"a recorded world needs P >= 1 ranks, got {P}")
        self.P, self.stack_kib = P, stack_kib
        self._local = threading.local()

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        """What ``run`` holds while the ranks run (the subclass's stand-in); here nothing."""
        yield

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        """Run ``fn(rank)`` for every rank, one rank at a time; the results in rank order."""
        P = self.P
        self._go = [threading.Lock() for _ in range(P)]
        for lock in self._go:
            lock.acquire()
        self._main = threading.Lock()
        self._main.acquire()
        self._ready: deque[int] = deque(range(P))
        self._queued = set(self._ready)  # the ranks in _ready
        self._waiting: dict[int, object] = {}
        self._finished, self._failure, self._abort = 0, None, False
        results: list[Any] = [None] * P

        def body(rank: int) -> None:
            self._go[rank].acquire()
            if self._abort:  # released only to unwind: it never started
                return
            self._local.rank = rank
            try:
                results[rank] = fn(rank)
            except _Aborted:
                return
            except BaseException as exc:  # noqa: BLE001 -- handed to the caller of run
                self._failure = self._failure or (rank, exc)
                self._abort = True
                self._main.release()
                return
            self._finished += 1
            self._hand_on()

        old = threading.stack_size(self.stack_kib * 1024)
        try:
            threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(P)]
            for t in threads:
                t.start()
        finally:
            threading.stack_size(old)
        with self.patched():
            self._hand_on()
            self._main.acquire()
        if self._finished < P:  # a failure or a deadlock: unwind the blocked ranks
            self._abort = True
            for rank in set(self._waiting) | set(self._ready):  # every thread blocked on its turn
                self._go[rank].release()
        for t in threads:
            t.join()
        if self._failure is not None:
            rank, exc = self._failure
            raise RuntimeError(f"rank {rank} of {P} failed: {exc!r}") from exc
        if self._finished < P:
            waits = ", ".join(f"rank {r}: {w}" for r, w in sorted(self._waiting.items())[:8])
            raise Deadlock(f"{len(self._waiting)} of {P} ranks wait forever ({waits})")
        return results

    def _hand_on(self) -> None:
        """Give the turn to the next ready rank, or back to ``run`` when there is none."""
        if self._ready and not self._abort:
            nxt = self._ready.popleft()
            self._queued.discard(nxt)
            self._go[nxt].release()
        else:
            self._main.release()

    def _block(self, rank: int, what: object, done: Callable[[], bool]) -> None:
        """This rank waits until ``done()``; other ranks run meanwhile."""
        while not done():
            self._waiting[rank] = what
            self._hand_on()
            self._go[rank].acquire()
            if self._abort:
                raise _Aborted
        self._waiting.pop(rank, None)

    def _wake(self, rank: int) -> None:
        if rank in self._waiting and rank not in self._queued:
            self._ready.append(rank)
            self._queued.add(rank)

    @property
    def rank(self) -> int:
        """The rank whose thread is calling."""
        return self._local.rank
