"""The round trace on real worker processes (gloo on loopback), and ``gtopk.perf.tracerun``
as a user runs it: events of separate processes line up on the host's one clock, the
trace changes no result, and the tool writes its tables (slow: worker groups start)."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import torch

from gtopk.perf.trace import call_events, critical_path
from gtopk.reducers import GTopKReducer
from gtopk.reducers.costmodel import Network
from gtopk.reducers.wire import POST_SEND, ROUND, RoundTrace
from gtopk.run.spawn import spawn
from tests.config import ROOT

pytestmark = pytest.mark.slow

M, DENSITY = 3000, 0.01  # k = 30
#: (algorithm, putback, transport): the rounds' own sockets (gloo's default: the tree compiled,
#: ``gtopk.reducers.native``, where it builds), the tree in Python over them, and gloo's calls
SETTINGS = [
    ("tree", "index", "auto"),
    ("tree", "index", "socket"),
    ("recursive_doubling", "index", "auto"),
    ("recursive_doubling", "exact", "auto"),
    ("tree", "index", "backend"),
    ("recursive_doubling", "exact", "backend"),
]


def traced_and_plain(rank: int, P: int) -> list[dict]:
    """Per setting, two calls on the same gradient with fresh reducers, traced and not."""
    out = []
    grad = torch.randn(M, generator=torch.Generator().manual_seed(rank))
    for algorithm, putback, transport in SETTINGS:
        plain = GTopKReducer(DENSITY, algorithm=algorithm, putback=putback, transport=transport)
        want, _ = plain.reduce(grad.clone())
        traced = GTopKReducer(DENSITY, algorithm=algorithm, putback=putback, transport=transport)
        traced.trace = RoundTrace()
        got, rec = traced.reduce(grad.clone())
        s0, s1 = traced.commu_span
        events = call_events(traced.trace.take(), s0, s1)
        eager = traced.trace.eager
        out.append({"same": torch.equal(want, got), "events": events, "bytes_sent": rec.bytes_sent, "eager": eager})
    return out


def test_traces_of_real_ranks_line_up_and_change_nothing():
    P = 3
    ranks = spawn(traced_and_plain, P, timeout=300)
    for n, (algorithm, putback, transport) in enumerate(SETTINGS):
        calls = [r[n] for r in ranks]
        assert all(c["same"] for c in calls), (algorithm, putback)
        assert all(c["eager"] == (transport != "backend") for c in calls)  # sockets buffer, gloo does not
        for c in calls:
            assert sum(e[3] for e in c["events"] if e[1] == POST_SEND) == c["bytes_sent"]
        if algorithm == "tree":  # root: 2 rounds up, 2 down; rank 1 (a leaf): one each way
            assert [sum(e[1] == ROUND for e in c["events"]) for c in calls][:2] == [4, 2]
        events, eager = [c["events"] for c in calls], calls[0]["eager"]
        b = critical_path(events, Network(alpha=1e-5, beta=1e-9), eager=eager)  # raises off one clock
        # how many messages the path waits for depends on the timing (a message that arrived
        # before its receive was posted costs the receiver nothing): at most those sent
        sent = sum(e[1] == POST_SEND for c in calls for e in c["events"])
        assert 0 <= b.messages <= sent and 0 <= b.span <= b.total
        assert b.skew + b.wire + b.transport + b.software == pytest.approx(b.total)


def test_tracerun_writes_its_tables(tmp_path):
    out = tmp_path / "trace"
    cmd = [sys.executable, "-m", "gtopk.perf.tracerun", "nodes=[2,3]", "m=[3000]", "density=0.01"]
    cmd += ["warmup=1", "steps=3", "pingpong.sizes=[8,1024]", "pingpong.reps=3", f"out={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "trace.csv") as f:
        summary = list(csv.DictReader(f))
    assert {(r["reducer"], r["nodes"]) for r in summary} == {
        (name, P) for name in ("gtopk_tree", "gtopk_rd", "topk") for P in ("2", "3")
    }
    with open(out / "steps.csv") as f:
        assert len(list(csv.DictReader(f))) == 3 * 2 * 3  # steps x P x reducers
    assert "| gtopk_tree | 3,000 | 3 |" in done.stdout
