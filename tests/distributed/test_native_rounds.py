"""gTop-k's compiled rounds, tree and recursive doubling, the exact put-back's sum and Ok-Topk's
rotations (``gtopk.reducers.native``,
``transport=native``/``auto``) on real worker processes: the same updates, residuals, dropped mass and message counts as the Python
rounds over the same sockets (``transport=socket``), bit for bit, at P = 2, 3, 5, 8 with both
put-backs and with ties; the same trace events, which the critical-path analysis reads; the
compiled barrier of ``align_timing``, and the timed span after it; a NaN refused (closed and hung peers:
``test_transport.py``)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from gtopk.reducers import GTopKReducer, native, transport
from gtopk.reducers.oktopk import OkTopKReducer
from gtopk.reducers.transport import SocketTransport
from gtopk.reducers.wire import RoundTrace
from gtopk.run.spawn import spawn

pytestmark = pytest.mark.skipif(native.why_unavailable() is not None, reason="no C++ compiler")


def both_ways(rank: int, P: int) -> list[str]:
    """Four steps of each case through the compiled tree and the Python rounds; what differs."""
    bad = []
    for m, density, algorithm in ((3000, 0.01, "tree"), (20_000, 0.05, "recursive_doubling"), (4000, 0.25, "tree")):
        for putback in ("index", "exact"):
            grads = [torch.randn(m, generator=torch.Generator().manual_seed(7 * s + rank)) for s in range(3)]
            grads.append((grads[0] * 2).round() / 2)  # ties everywhere: the tie rule decides
            got = {}
            for tr in ("native", "socket"):
                r = GTopKReducer(density, algorithm=algorithm, putback=putback, transport=tr)
                r.diagnostics = True
                steps = []
                for g in grads:
                    u, rec = r.reduce(g.clone())
                    steps.append((u, (rec.lost_l1, rec.messages_sent, rec.bytes_sent, rec.bytes_recv, rec.update_nnz)))
                got[tr] = (steps, r.feedback.residual, r._plan is not None)
            (nat, res_n, compiled), (py, res_p, _) = got["native"], got["socket"]
            if not compiled:
                bad.append(f"{m} {algorithm} {putback}: the compiled rounds were not used")
            for n, ((u1, c1), (u2, c2)) in enumerate(zip(nat, py)):
                if not torch.equal(u1, u2) or c1 != c2:
                    bad.append(f"{m} {algorithm} {putback} step {n}: {c1} != {c2} or updates differ")
            if not torch.equal(res_n, res_p):
                bad.append(f"{m} {algorithm} {putback}: residuals differ")
    return bad


@pytest.mark.parametrize("P", [2, 3, 5, 8])
def test_the_compiled_rounds_are_the_python_rounds_bit_for_bit(P):
    assert spawn(both_ways, P, timeout=300) == [[]] * P


def oktopk_both_ways(rank: int, P: int) -> list[str]:
    """Eight Ok-Topk steps (regions re-computed, exact and threshold steps) with its rotations
    compiled and in Python on the sockets; what differs."""
    got = {}
    for tr in ("native", "socket"):
        r, out = OkTopKReducer(0.02, threshold_period=3, boundary_period=4, transport=tr), []
        for s in range(8):
            u, rec = r.reduce(torch.randn(6000, generator=torch.Generator().manual_seed(11 * s + rank)))
            out.append((u, rec.messages_sent, rec.bytes_sent, rec.bytes_recv))
        got[tr] = out, r.feedback.residual
    (nat, res_n), (py, res_p) = got["native"], got["socket"]
    bad = [f"step {n}" for n, (a, b) in enumerate(zip(nat, py)) if not torch.equal(a[0], b[0]) or a[1:] != b[1:]]
    return bad + ([] if torch.equal(res_n, res_p) else ["residuals differ"])


@pytest.mark.parametrize("P", [3, 4])
def test_oktopk_s_compiled_rotations_are_its_python_rotations_bit_for_bit(P):
    assert spawn(oktopk_both_ways, P, timeout=300) == [[]] * P


def traced(rank: int, P: int) -> dict:
    """One traced reduce each way and put-back: the events' kinds and peers (times aside)."""
    out = {}
    x = torch.randn(5000, generator=torch.Generator().manual_seed(rank))
    for case in CASES:
        for tr in ("native", "socket"):
            r = GTopKReducer(0.01, algorithm=case[0], putback=case[1], transport=tr, align_timing=True)
            r.trace = RoundTrace()
            r.reduce(x.clone())
            start = r.commu_span[0]
            got = [(kind, a, b) for t, kind, a, b in r.trace.take() if t >= start and kind != "post_recv"]
            out[case, tr] = got, r.trace.eager
    return out


CASES = [(algorithm, putback) for algorithm in ("tree", "recursive_doubling") for putback in ("index", "exact")]


def test_the_compiled_rounds_record_the_python_rounds_events():
    for got in spawn(traced, 5, timeout=300):  # P = 5: recursive doubling folds rank 4 in
        for case in CASES:
            (native_events, eager), (python_events, _) = got[case, "native"], got[case, "socket"]
            assert native_events == python_events and native_events and eager, case


def barrier_after_rank_0(rank: int, P: int, mark: str) -> bool:
    """Rank 0 writes ``mark`` and only then enters the compiled barrier; the others enter at
    once: each finds the file when it leaves."""
    t = SocketTransport()
    if rank == 0:
        open(mark, "w").close()
    native.barrier(t.fds(), rank, timeout_s=60)
    return os.path.exists(mark)


def test_no_rank_leaves_the_compiled_barrier_before_the_last_arrives(tmp_path):
    assert spawn(barrier_after_rank_0, 5, (str(tmp_path / "rank0"),), timeout=300) == [True] * 5


def late_rank(rank: int, P: int, mark: str, tr: str) -> tuple[float, float, float, list]:
    """A reduce under ``align_timing`` that the other ranks enter only after rank 0 has
    written ``mark``: (entry clock, span start, span end, its events' (clock, kind))."""
    r = GTopKReducer(0.01, transport=tr, align_timing=True)
    r.trace = RoundTrace()
    x = torch.randn(5000, generator=torch.Generator().manual_seed(rank))
    r.reduce(x.clone())  # the first makes the sockets (which waits for every rank)
    r.trace.take()
    if rank == 0:
        open(mark, "w").close()
    while not os.path.exists(mark):
        time.sleep(0.001)
    entered = time.perf_counter()
    r.reduce(x.clone())
    return entered, *r.commu_span, [e[:2] for e in r.trace.take()]


@pytest.mark.parametrize("tr", ["native", "socket"])
def test_the_timed_span_starts_after_the_last_rank_enters_and_holds_the_rounds(tmp_path, tr):
    got = spawn(late_rank, 4, (str(tmp_path / "rank0"), tr), timeout=300)
    last_in = max(g[0] for g in got)
    for _, s0, s1, events in got:
        assert last_in <= s0 <= s1  # align_timing's barrier is before the span (in the call, compiled)
        # only receives posted early (the Python rounds', during the selection) come before it
        assert events and all(s0 <= t <= s1 or (t < s0 and kind == "post_recv") for t, kind in events)


def entries(rank: int, k: int = 64) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(rank).standard_normal(1000).astype(np.float32)
    idx = np.sort(np.argsort(-np.abs(g), kind="stable")[:k]).astype(np.int64)
    return idx, g[idx]


def nan_merge(rank: int, P: int) -> str:
    t = SocketTransport()
    idx, val = entries(rank)
    if rank == 1:
        val[3] = np.nan
    try:
        native.Tree(t.fds(), rank, 64, 4, True)(idx, val, 5.0)
    except (FloatingPointError, ConnectionError, TimeoutError) as e:
        return type(e).__name__ + ": " + str(e)
    return "no error"


def test_a_nan_in_a_merge_is_refused_and_no_rank_hangs():
    got = spawn(nan_merge, 2, timeout=300)
    assert got[0].startswith("FloatingPointError") and "not finite" in got[0]
    assert got[1].startswith(("ConnectionError", "TimeoutError"))


def test_transport_native_is_refused_where_it_does_not_build(monkeypatch):
    monkeypatch.setattr(native, "_failed", "c++ not found")
    monkeypatch.setattr(native, "_lib", None)
    with pytest.raises(ValueError, match=r"reducer.transport=native: .*c\+\+ not found.*reducer.transport=socket"):
        GTopKReducer(0.01, transport="native")


def test_a_rank_spins_less_where_ranks_share_cores_and_not_under_dilation(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("GTOPK_TIME_DILATION", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert native.spin_seconds(cores) == native.SPIN_S > 0
    assert 0 < native.spin_seconds(cores + 1) == native.SHARED_SPIN_S < native.SPIN_S
    monkeypatch.setenv("GTOPK_TIME_DILATION", "4")
    assert native.spin_seconds(1) == 0.0  # a spin would be paced D-fold
    assert transport.TRANSPORTS == ("auto", "native", "socket", "backend")
