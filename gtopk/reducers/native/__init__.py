"""gTop-k's all-reduce compiled: every round of a call in one C++ function (``rounds.cpp``), for
the tree and recursive doubling (``Tree``), the exact put-back's sum (``Tree.sum``), and
Ok-Topk's rotation steps (``steps``).

A round of the Python schedules (``gtopk.reducers.schedules``) over the rounds' sockets costs
tens of microseconds of interpreter work per message (posting, encoding, decoding, the NumPy
merge's ten array calls), and several times that after the rank slept in ``select``: on the
few-kB messages of a small model that is most of a call. ``rounds.cpp`` runs the whole tree
(reduce to rank 0, broadcast back) on the ``SocketTransport``'s connections without returning
to Python: the same schedule, wire bytes and merge, bit for bit
(``tests/distributed/test_native_rounds.py`` compares it with the Python rounds). A receive
that finds nothing retries for ``spin_s`` before it sleeps in ``poll`` (``spin_seconds``).

It is plain C++ called through ``ctypes`` (which releases the GIL during the call) on the
arrays' memory: no Python module built against torch's headers, a compile of about a second.
Built by ``make setup`` (``python -m gtopk.reducers.native``) with the system's C++ compiler
(``CXX``, else ``c++``) into ``_rounds-<hash of the source>.so`` beside it, or on first use
where that file is missing (written under a temporary name and renamed, so that ranks that
start together never load a half-written file). Where no compiler works, ``why_unavailable()``
says why and ``transport=auto`` takes the Python rounds (the same results, slower).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("rounds.cpp")
_lib: ctypes.CDLL | None = None
_failed: str | None = None
#: the event kinds of ``rounds.cpp``, as ``gtopk.reducers.wire``'s names
KINDS = ("round", "post_send", "post_recv", "sent", "received", "merged")
MSGS, BYTES_SENT, BYTES_RECV, MERGE_S, N_EVENTS, ERR_PEER, ERR_NO, SPAN0, SPAN1 = range(9)
#: ``Tree.__call__``'s ``align``: the barriers of ``align_timing`` run inside the call
BEFORE, AFTER = 1, 2


class _TreeArgs(ctypes.Structure):
    """``rounds.cpp``'s ``TreeArgs``, field for field."""

    _fields_ = [
        (name, ctypes.c_void_p if kind == "p" else ctypes.c_int64 if kind == "i" else ctypes.c_double)
        for name, kind in (
            ("fds", "p"), ("rank", "i"), ("P", "i"), ("k", "i"), ("ibytes", "i"), ("in_i", "p"), ("in_v", "p"),
            ("with_values", "i"), ("out_i", "p"), ("out_v", "p"), ("drop_i", "p"), ("drop_v", "p"),
            ("n_drop", "p"), ("timeout_s", "d"), ("spin_s", "d"), ("dilation", "i"), ("threads", "d"),
            ("pace", "p"), ("stats", "p"), ("events", "p"), ("max_events", "i"), ("align", "i"),
        )
    ]  # fmt: skip


def library_path() -> Path:
    """Local. Where the library of the current source lives."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return SOURCE.with_name(f"_rounds-{digest}.so")


def build() -> Path:
    """Local. Compile ``rounds.cpp`` (unless its library is there); the library's path.
    Raises ``RuntimeError`` with the compiler's message where it fails."""
    out = library_path()
    if out.exists():
        return out
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [*cxx, "-O2", "-std=c++17", "-shared", "-fPIC", str(SOURCE), "-o", tmp]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-400:]}")
        os.replace(tmp, out)
    except OSError as e:  # no compiler, or a read-only tree
        raise RuntimeError(f"{' '.join(cmd)} could not run: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _load() -> ctypes.CDLL | None:
    global _lib, _failed
    if _lib is not None or _failed is not None:
        return _lib
    try:
        lib = ctypes.CDLL(str(build()))
    except (RuntimeError, OSError) as e:
        _failed = str(e)
        return None
    p, f64, i32 = ctypes.c_void_p, ctypes.c_double, ctypes.c_int
    fn = lib.gtopk_tree_allreduce
    fn.argtypes = [ctypes.POINTER(_TreeArgs)]
    fn.restype = i32
    for name in ("gtopk_rd_allreduce", "gtopk_rd_sum"):
        getattr(lib, name).argtypes = [ctypes.POINTER(_TreeArgs)]
        getattr(lib, name).restype = i32
    lib.gtopk_steps.argtypes = [ctypes.POINTER(_StepArgs)]
    lib.gtopk_steps.restype = i32
    lib.gtopk_barrier.argtypes = [p, i32, i32, f64, f64, p]
    lib.gtopk_barrier.restype = i32
    _lib = lib
    return lib


def _loaded() -> ctypes.CDLL:
    """The library, else a RuntimeError saying why it does not load."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"the compiled gTop-k rounds are unavailable: {_failed}")
    return lib


def why_unavailable() -> str | None:
    """Local. None where the compiled rounds load (building them first where needed), else why not."""
    _load()
    return _failed


#: how long a receive retries before it sleeps in ``poll`` (``spin_seconds``): a rank with a
#: core of its own, and one that shares its core with other ranks (it yields between tries)
SPIN_S, SHARED_SPIN_S = 200e-6, 50e-6


def spin_seconds(world_size: int) -> float:
    """Local. How long this rank's receives retry before sleeping in ``poll``: ``SPIN_S``
    where every rank of the group may have a core of its own on this host (its
    ``LOCAL_WORLD_SIZE``, else the group's size, at most the cores it may run on), else
    ``SHARED_SPIN_S`` (each try yields the core: at most that much CPU a wait taken from
    ranks that compute); 0 under time dilation (a spin would be CPU time, paced D-fold)."""
    from gtopk.host import dilation

    if dilation() > 1:
        return 0.0
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return SPIN_S if local <= len(os.sched_getaffinity(0)) else SHARED_SPIN_S


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


class _StepArgs(ctypes.Structure):
    """``rounds.cpp``'s ``StepArgs``, field for field."""

    _fields_ = [
        (name, ctypes.c_void_p if kind == "p" else ctypes.c_int64 if kind == "i" else ctypes.c_double)
        for name, kind in (
            ("fds", "p"), ("rank", "i"), ("P", "i"), ("n", "i"), ("dst", "p"), ("slen", "p"), ("src", "p"),
            ("rlen", "p"), ("sbuf", "p"), ("rbuf", "p"), ("timeout_s", "d"), ("spin_s", "d"), ("dilation", "i"),
            ("threads", "d"), ("pace", "p"), ("stats", "p"),
        )
    ]  # fmt: skip


def steps(
    fds: list[int],
    rank: int,
    moves: list[tuple[int, np.ndarray | None, int, np.ndarray | None]],
    *,
    timeout_s: float,
    spin_s: float = 0.0,
    dilation: int = 1,
    threads: int = 1,
    pace: list[float] | None = None,
) -> None:
    """Collective in pairs (what this rank sends to d in a step, d receives from it in its
    matching step). Ok-Topk's rotation steps in one compiled call: ``moves[i] = (dst, data,
    src, buf)``, send the uint8 array ``data`` to ``dst`` while receiving ``buf.size`` bytes
    from ``src`` into ``buf`` (either None: nothing), step after step. ``pace``: as ``Tree``'s
    (D > 1), updated in place. Raises as ``Tree.__call__``."""
    lib = _loaded()
    n = len(moves)
    dst = np.array([d if s is not None else -1 for d, s, _, _ in moves], dtype=np.int64)
    src = np.array([r if b is not None else -1 for _, _, r, b in moves], dtype=np.int64)
    slen = np.array([0 if s is None else s.size for _, s, _, _ in moves], dtype=np.int64)
    rlen = np.array([0 if b is None else b.size for _, _, _, b in moves], dtype=np.int64)
    sends = [s for _, s, _, _ in moves if s is not None and s.size]
    sbuf = np.concatenate(sends) if sends else np.empty(0, dtype=np.uint8)
    rbuf = np.empty(int(rlen.sum()), dtype=np.uint8)
    stats, state = np.zeros(SPAN1 + 1, dtype=np.float64), np.array(pace if pace is not None else [-1.0, 0, 0, 0])
    fd = np.asarray(fds, dtype=np.int32)
    args = _StepArgs(
        _ptr(fd), rank, len(fds), n, _ptr(dst), _ptr(slen), _ptr(src), _ptr(rlen), _ptr(sbuf), _ptr(rbuf),
        timeout_s, spin_s, dilation, float(threads), _ptr(state), _ptr(stats),
    )  # fmt: skip
    code = lib.gtopk_steps(ctypes.byref(args))
    if pace is not None:
        pace[:] = state.tolist()
    if code:
        raise _failure(code, rank, int(stats[ERR_PEER]), int(stats[ERR_NO]), timeout_s)
    at = 0
    for _, _, _, b in moves:
        if b is not None:
            b[:] = rbuf[at : at + b.size]
            at += b.size


class Rounds:
    """What one call did besides its result: counters, merge time, events, drops, and
    ``span``: the clock as its first round began and as its last ended (``align``: read
    as the ranks leave the first barrier and before the second)."""

    __slots__ = ("messages", "bytes_sent", "bytes_recv", "merge_s", "events", "drops", "span")

    def __init__(self, stats: np.ndarray, events: list, drops: list | None):
        self.messages, self.bytes_sent, self.bytes_recv = (
            int(stats[MSGS]),
            int(stats[BYTES_SENT]),
            int(stats[BYTES_RECV]),
        )
        self.merge_s, self.events, self.drops = float(stats[MERGE_S]), events, drops
        self.span = (float(stats[SPAN0]), float(stats[SPAN1]))


class Tree:
    """One rank's part of gTop-k's all-reduce over ``fds[p]``, the connection to rank p
    (``SocketTransport.fds``), for messages of ``k`` entries (``index_bytes`` 4 or 8), its
    arguments and buffers prepared once (a call then costs one ``ctypes`` call and a few
    microseconds around it). ``algorithm``: ``tree`` or ``recursive_doubling`` (the schedules
    of ``gtopk.reducers.schedules``). ``with_values``: send the result back with its values
    (the paper's put-back), else indices only (the exact put-back). ``dilation``: D of ``gtopk.host``
    (> 1: the call paces its CPU time as ``gtopk.host.now`` does, its state in and out).
    ``trace``: keep the events. ``drops``: keep what each merge dropped."""

    def __init__(
        self,
        fds: list[int],
        rank: int,
        k: int,
        index_bytes: int,
        with_values: bool,
        *,
        algorithm: str = "tree",
        spin_s: float = 0.0,
        dilation: int = 1,
        threads: int = 1,
        trace: bool = False,
        drops: bool = False,
    ):
        lib = _loaded()
        P = len(fds)
        if algorithm not in ("tree", "recursive_doubling"):
            raise ValueError(f"algorithm={algorithm!r}: the compiled rounds run tree or recursive_doubling")
        tree = algorithm == "tree"
        self.fn = lib.gtopk_tree_allreduce if tree else lib.gtopk_rd_allreduce
        self.rank, self.P, self.k, self.with_values, self._sum = rank, P, k, with_values, lib.gtopk_rd_sum
        self.rounds = max(1, (P - 1).bit_length())  # merges of a rank: at most this many either way
        P2 = 1 << (P.bit_length() - 1)
        if tree:
            self.merges = sum(1 for r in range(self.rounds) if rank % (2 << r) == 0 and rank + (1 << r) < P)
        else:  # the fold's, then one per exchange (none above P2)
            self.merges = 0 if rank >= P2 else (rank + P2 < P) + P2.bit_length() - 1
        self.dilation, self.trace, self.drops = dilation, trace, drops
        self._fds = np.asarray(fds, dtype=np.int32)
        self.drop_i = np.empty((self.rounds, 2 * k), dtype=np.int64) if drops else None
        self.drop_v = np.empty((self.rounds, 2 * k), dtype=np.float32) if drops else None
        self.n_drop = np.zeros(self.rounds, dtype=np.int64) if drops else None
        self.stats = np.zeros(SPAN1 + 1, dtype=np.float64)
        self.max_events = 8 * self.rounds + 8
        self.events = np.zeros((self.max_events, 4), dtype=np.float64) if trace else None
        self.pace = np.array([-1.0, 0.0, 0.0, 0.0])
        self.args = _TreeArgs(
            _ptr(self._fds), rank, P, k, index_bytes, None, None, int(with_values), None, None,
            _ptr(self.drop_i), _ptr(self.drop_v), _ptr(self.n_drop), 0.0, spin_s, dilation, float(threads),
            _ptr(self.pace), _ptr(self.stats), _ptr(self.events), self.max_events, 0,
        )  # fmt: skip
        self._byref = ctypes.byref(self.args)

    def __call__(
        self, idx: np.ndarray, val: np.ndarray, timeout_s: float, pace: list[float] | None = None, align: int = 0
    ) -> tuple[np.ndarray, np.ndarray | None, Rounds]:
        """Collective (every rank of the group, with ``Tree``s of the same ``k``,
        ``index_bytes``, ``with_values`` and ``align``). The all-reduce of ``(idx, val)``,
        this rank's k entries (ascending indices): the final k indices (int64, ascending) and,
        with values, their values. ``pace``: ``gtopk.host.pacing_state()`` (D > 1), updated in
        place. ``align``: ``BEFORE`` | ``AFTER``, the barrier of ``align_timing`` before the
        first round and after the last, in the call (the span's clock read as the ranks leave
        the first, not after a return to Python; neither barrier counted in the rounds).
        Raises ``TimeoutError``, ``ConnectionError`` (naming the rank), ``FloatingPointError``
        (a NaN in a merge)."""
        in_i = idx if idx.dtype == np.int64 and idx.flags.c_contiguous else np.ascontiguousarray(idx, np.int64)
        in_v = val if val.dtype == np.float32 and val.flags.c_contiguous else np.ascontiguousarray(val, np.float32)
        out_i, out_v = np.empty(self.k, dtype=np.int64), np.empty(self.k, dtype=np.float32)
        a = self.args
        a.in_i, a.in_v, a.out_i, a.out_v, a.timeout_s = _ptr(in_i), _ptr(in_v), _ptr(out_i), _ptr(out_v), timeout_s
        a.align = align
        evs = self._run(self.fn, timeout_s, pace)
        lost = None
        if self.drops:
            di, dv, nd = self.drop_i, self.drop_v, self.n_drop
            lost = [(di[n, : nd[n]].copy(), dv[n, : nd[n]].copy()) if nd[n] else None for n in range(self.merges)]
        return out_i, (out_v if self.with_values else None), Rounds(self.stats, evs, lost)

    def sum(
        self, values: np.ndarray, timeout_s: float, pace: list[float] | None = None, align: int = 0
    ) -> tuple[np.ndarray, Rounds]:
        """Collective (as ``__call__``). The exact put-back's all-reduce (sum) of this rank's
        k float32 ``values``: recursive doubling with folding on the same connections, as
        ``gtopk.reducers.schedules.recursive_doubling`` with ``a + b`` (bit for bit; the same
        messages and events). ``align``: ``AFTER`` only (the span's end read before it)."""
        in_v = (
            values
            if values.dtype == np.float32 and values.flags.c_contiguous
            else np.ascontiguousarray(values, np.float32)
        )
        out_v = np.empty(self.k, dtype=np.float32)
        a = self.args
        a.in_v, a.out_v, a.timeout_s, a.align = _ptr(in_v), _ptr(out_v), timeout_s, align & AFTER
        evs = self._run(self._sum, timeout_s, pace)
        return out_v, Rounds(self.stats, evs, None)

    def _run(self, fn, timeout_s: float, pace: list[float] | None) -> list:
        """One compiled call on the prepared arguments; its events (raises its failure)."""
        if pace is not None:
            self.pace[:] = pace
        code = fn(self._byref)
        if pace is not None:
            pace[:] = self.pace.tolist()
        st = self.stats
        if code:
            raise _failure(code, self.rank, int(st[ERR_PEER]), int(st[ERR_NO]), timeout_s)
        if not self.trace:
            return []
        return [(e[0], KINDS[int(e[1])], int(e[2]), int(e[3])) for e in self.events[: int(st[N_EVENTS])].tolist()]


def barrier(fds: list[int], rank: int, *, timeout_s: float, spin_s: float = 0.0) -> None:
    """Collective (every rank of the sockets' group). A dissemination barrier over the
    connections ``fds`` (one byte per round, ceil(log2 P) rounds): its ranks leave it within
    a message's time of each other, where a receive may spin (``spin_seconds``), so that a
    clock read right after it starts every rank's span together (``align_timing``). Raises
    as ``tree_allreduce``."""
    lib = _loaded()
    stats = np.zeros(SPAN1 + 1, dtype=np.float64)
    code = lib.gtopk_barrier(_ptr(np.asarray(fds, dtype=np.int32)), rank, len(fds), timeout_s, spin_s, _ptr(stats))
    if code:
        raise _failure(code, rank, int(stats[ERR_PEER]), int(stats[ERR_NO]), timeout_s)


def _failure(code: int, rank: int, peer: int, errno_: int, timeout_s: float) -> Exception:
    if code == -1:
        return TimeoutError(
            f"rank {rank}: the sparse rounds' sockets timed out after {timeout_s:g} s waiting for rank(s) [{peer}]"
        )
    if code == -2:
        return ConnectionError(f"rank {rank}: rank {peer} closed its connection of the sparse rounds")
    if code == -3:
        return FloatingPointError(
            f"rank {rank}: a NaN among the values merged with rank {peer}'s: the gradient is not finite"
        )
    return ConnectionError(f"rank {rank}: the sparse rounds' socket to rank {peer} failed: {os.strerror(errno_)}")
