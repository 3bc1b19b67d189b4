"""The round trace (``gtopk.reducers.wire.RoundTrace``) and its critical path
(``gtopk.perf.trace``): in one process, over the recorded world's stand-in for
``torch.distributed`` (``gtopk.perf.virtualworld``), whose logical clocks serve as the trace's
clock (a message costs ``alpha + bytes * beta`` of them, local work nothing); and on
timelines built by hand."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gtopk.perf.trace import COLL_DONE, POST_COLL, call_events, critical_path
from gtopk.perf.virtualworld import BYTES, ROUNDS, RecordedWorld
from gtopk.reducers import GTopKReducer, wire
from gtopk.reducers.costmodel import Network
from gtopk.reducers.wire import END, MERGED, POST_RECV, POST_SEND, RECEIVED, ROUND, SENT, START, RoundTrace

M, DENSITY = 1000, 0.004  # k = 4: a message of 32 bytes (16 with indices only)
MIXED = Network(alpha=1.0, beta=0.25)  # bytes weigh beside latency
SETTINGS = [{"algorithm": a, "putback": p} for a in ("tree", "recursive_doubling") for p in ("index", "exact")]


def grads(P: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(M, generator=g) for _ in range(P)]


def run(P: int, settings: dict, net: Network = ROUNDS, traced: bool = True, seed: int = 0):
    """One ``reduce`` per rank in a recorded world on ``net``; per rank (events with START
    and END, or None untraced; update; residual; record), and the world."""
    world = RecordedWorld(P, nets=(net,))
    gs = grads(P, seed)

    def rank_fn(rank: int):
        reducer = GTopKReducer(DENSITY, **settings)
        clock = lambda: world.clocks[world.rank][0]  # noqa: E731
        if traced:
            reducer.trace = RoundTrace(clock)
        start = clock()
        update, rec = reducer.reduce(gs[rank].clone())
        events = None
        if traced:
            events = call_events(reducer.trace.take(), start, clock())
        return events, update, reducer.feedback.residual.clone(), rec

    return world.run(rank_fn), world


def kinds(events, kind: str) -> list:
    return [e for e in events if e[1] == kind]


@pytest.mark.parametrize("P", [2, 4, 8, 16, 3, 6])
def test_rounds_per_rank_are_the_schedules(P):
    """By hand: the tree's root takes part in every round up and down, ceil(log2 P) each; a
    leaf (odd rank) sends once and receives once. Recursive doubling: log2(P2) exchanges,
    plus a fold and a return for the ranks below P2 with a partner above, two rounds for
    the ranks above P2 (P2: the largest power of two <= P)."""
    levels = (P - 1).bit_length()
    out, _ = run(P, {"algorithm": "tree", "putback": "index"})
    assert len(kinds(out[0][0], ROUND)) == 2 * levels
    assert all(len(kinds(out[r][0], ROUND)) == 2 for r in range(1, P, 2))
    P2 = 1 << (P.bit_length() - 1)
    out, _ = run(P, {"algorithm": "recursive_doubling", "putback": "index"})
    for rank in range(P):
        want = 2 if rank >= P2 else (P2.bit_length() - 1) + 2 * (rank + P2 < P)
        assert len(kinds(out[rank][0], ROUND)) == want, rank


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(s.values()))
@pytest.mark.parametrize("P", [2, 3, 5, 8])
def test_traced_messages_are_the_messages_sent(P, settings):
    """Every posted send in the trace is a message the world carried (source, destination,
    bytes), and its bytes are the rank's record; every receive completed is one it got."""
    out, world = run(P, settings)
    for rank, (events, _, _, rec) in enumerate(out):
        carried = Counter((m.dst, m.nbytes) for m in world.messages if m.src == rank)
        got = Counter((m.src, m.nbytes) for m in world.messages if m.dst == rank)
        assert Counter((e[2], e[3]) for e in kinds(events, POST_SEND)) == carried
        assert Counter((e[2], e[3]) for e in kinds(events, SENT)) == carried
        assert Counter((e[2], e[3]) for e in kinds(events, RECEIVED)) == got
        assert Counter((e[2], e[3]) for e in kinds(events, POST_RECV)) == got
        assert sum(e[3] for e in kinds(events, POST_SEND)) == rec.bytes_sent
        assert len(kinds(events, POST_SEND)) == rec.messages_sent
    k = int(DENSITY * M)
    sizes = {m.nbytes for m in world.messages}
    assert sizes <= {8 * k, 4 * k}  # (index, value) entries; indices or values alone (exact)


def test_receives_are_posted_before_they_are_due():
    """gloo sends only to a posted receive (``gtopk.reducers.wire``): recursive doubling posts
    every receive before its first round; the tree's root posts each receive one round
    ahead (before merging the one before), a leaf its broadcast receive before that round."""
    out, _ = run(8, {"algorithm": "recursive_doubling", "putback": "index"})
    for events, *_ in out:
        order = [e[1] for e in events]
        assert max(i for i, k in enumerate(order) if k == POST_RECV) < order.index(ROUND)
    out, _ = run(8, {"algorithm": "tree", "putback": "index"})
    one_round = [ROUND, RECEIVED, POST_RECV, MERGED]
    reduce = [START, POST_RECV, *one_round, *one_round, ROUND, RECEIVED, MERGED]
    assert [e[1] for e in out[0][0]] == [*reduce, *[ROUND, POST_SEND, SENT] * 3, END]
    assert [e[1] for e in out[1][0]] == [START, ROUND, POST_SEND, SENT, POST_RECV, ROUND, RECEIVED, END]


@pytest.mark.parametrize("algorithm", ["tree", "recursive_doubling"])
@pytest.mark.parametrize("P", [2, 3, 5, 8, 16])
def test_first_receives_are_posted_before_the_selection(monkeypatch, P, algorithm):
    """The receives a schedule posts first (the tree's round-0 child; every receive of
    recursive doubling) are posted before the rank selects, so neither the posting nor the
    sender's wait for it is on the collective's path: the root's first receive, and every
    rank's receives of recursive doubling (a rank above P2: its result's)."""
    seen: dict[int, int] = {}
    real = GTopKReducer._reduce

    class Counted:  # the reducer's selector, counting the receives posted when it is called
        def __init__(self, reducer):
            self.reducer, self.selector = reducer, reducer.selector

        def pick(self, acc, k):
            seen[self.reducer.rank] = len(kinds(self.reducer.trace.events, POST_RECV))
            return self.selector.pick(acc, k)

    def spy(self, grad, rec, clock, out=None):
        self.selector = Counted(self)
        return real(self, grad, rec, clock, out)

    monkeypatch.setattr(GTopKReducer, "_reduce", spy)
    out, _ = run(P, {"algorithm": algorithm, "putback": "index"})
    P2 = 1 << (P.bit_length() - 1)
    for rank in range(P):
        if algorithm == "tree":
            want = 1 if rank % 2 == 0 and rank + 1 < P else 0
        else:
            want = len(kinds(out[rank][0], POST_RECV))  # all of them
            assert want == (1 if rank >= P2 else (P2.bit_length() - 1) + (rank + P2 < P))
        assert seen[rank] == want, rank
    assert seen[0] >= 1


def test_an_early_receive_the_schedule_does_not_take_is_refused(monkeypatch):
    """A posted receive left unmatched would take the next call's message: refused."""
    import gtopk.reducers.gtopk as gtopk_module

    wrong = lambda rank, P, nbytes: [(1, nbytes)] if rank == 2 else []  # noqa: E731 (rank 2's parent is 0)
    monkeypatch.setattr(gtopk_module, "tree_reduce_first", wrong)
    with pytest.raises(RuntimeError, match="rank 2 of 3 failed.*posted early were never used"):
        run(3, {"algorithm": "tree", "putback": "index"})


def test_tracing_off_records_nothing_and_changes_no_result(monkeypatch):
    traced, _ = run(5, {"algorithm": "tree", "putback": "index"})
    made = []
    monkeypatch.setattr(wire.RoundTrace, "__init__", lambda self, *a: made.append(a))
    monkeypatch.setattr(wire.RoundTrace, "__call__", lambda self, *a: made.append(a))
    plain, _ = run(5, {"algorithm": "tree", "putback": "index"}, traced=False)
    assert made == []
    for (_, u1, r1, rec1), (_, u2, r2, rec2) in zip(traced, plain):
        assert torch.equal(u1, u2) and torch.equal(r1, r2)
        assert (rec1.bytes_sent, rec1.messages_sent) == (rec2.bytes_sent, rec2.messages_sent)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(s.values()))
@pytest.mark.parametrize("P", [2, 3, 4, 5, 6, 7, 8, 9, 16])
def test_critical_path_on_the_recorded_clock_is_the_cost_model(P, settings):
    """Local work costs nothing on the recorded clock and every rank starts at 0: the path
    is messages only (no skew, software or transport) and its length is the cost model's
    critical path, in messages, bytes and both."""
    for net in (ROUNDS, BYTES, MIXED):
        out, _ = run(P, settings, net)
        b = critical_path([o[0] for o in out], net)
        model = GTopKReducer.predict_commu(P, M, net, DENSITY, **settings)
        assert b.total == pytest.approx(model)
        assert b.wire == pytest.approx(model)
        assert (b.skew, b.software, b.transport) == (0.0, 0.0, 0.0)
        if net is ROUNDS:
            assert b.messages == model


NET = Network(alpha=1.0, beta=0.0)


def test_a_late_partner_is_skew_and_its_own_work_is_software():
    """Rank 1 starts at 5 and sends at 6; rank 0 waits from 1 and holds the data at 10,
    merges until 12. Path (back from rank 0's end): merge 2, transfer 6..10 (wire 1,
    transport 3), rank 1's packing 5..6, then skew 5 (rank 1 started 5 after rank 0)."""
    r0 = [(0, START, 0, 0), (1, POST_RECV, 1, 8), (10, RECEIVED, 1, 8), (12, MERGED, 0, 0), (12, END, 0, 0)]
    r1 = [(5, START, 0, 0), (6, POST_SEND, 0, 8), (9, SENT, 0, 8), (9, END, 0, 0)]
    b = critical_path([r0, r1], NET)
    assert (b.total, b.span, b.skew, b.wire, b.transport, b.software, b.merge) == (12, 7, 5, 1, 3, 3, 2)
    assert (b.messages, b.path_bytes) == (1, 8)
    assert b.skew + b.wire + b.transport + b.software == b.total


def test_a_message_already_due_is_waited_for_on_this_rank():
    """The partner posted at 2, before this rank began to wait (4): the transfer is the wait
    4..5 on this rank, and the path goes on back on this rank (its own work 0..4)."""
    r0 = [(0, START, 0, 0), (0, POST_RECV, 1, 8), (4, ROUND, 0, 0), (5, RECEIVED, 1, 8), (5, END, 0, 0)]
    r1 = [(0, START, 0, 0), (2, POST_SEND, 0, 8), (3, SENT, 0, 8), (3, END, 0, 0)]
    b = critical_path([r0, r1], NET)
    assert (b.total, b.skew, b.wire, b.transport, b.software) == (5, 0, 1, 0, 4)


def test_an_exchange_waits_for_the_partners_send():
    """Both post their sends (rank 0 at 1, rank 1 at 3, receives posted at 0); the exchange
    completes at 6 on both: the path goes to rank 1 at 3 (its send gates rank 0)."""
    ex = lambda peer, send_at: [  # noqa: E731
        (0, START, 0, 0),
        (0, POST_RECV, peer, 8),
        (send_at, POST_SEND, peer, 8),
        (6, SENT, peer, 8),
        (6, RECEIVED, peer, 8),
        (6, END, 0, 0),
    ]
    b = critical_path([ex(1, 1), ex(0, 3)], NET)
    assert (b.total, b.skew, b.wire, b.transport, b.software, b.messages) == (6, 0, 1, 2, 3, 1)


def test_a_receive_posted_early_is_ready_at_the_start():
    """Rank 0 posted its receive at -5, while it selected, and starts at 0; rank 1 starts at
    3 and sends at 4; rank 0 holds the data at 10 (the early events come first:
    ``call_events``). The path goes back to rank 1's send, its own work 3..4, then skew 3."""
    r0 = call_events([(-5, POST_RECV, 1, 8), (10, RECEIVED, 1, 8)], 0, 10)
    assert [e[1] for e in r0] == [POST_RECV, START, RECEIVED, END]
    r1 = call_events([(4, POST_SEND, 0, 8), (9, SENT, 0, 8)], 3, 9)
    b = critical_path([r0, r1], NET)
    assert (b.total, b.skew, b.wire, b.transport, b.software) == (10, 3, 1, 5, 1)


def test_a_walk_that_reaches_an_early_receive_stops_there():
    """Rank 0 starts at 0 and sends at 1; rank 1, still selecting, posts its receive only at
    2 (early: it starts at 5); the data lands at 8. The send waited for rank 1's post: the
    path is the transfer 2..8 and, before it, skew 2 (not rank 1's selection)."""
    r0 = call_events([(1, POST_SEND, 1, 8), (8, SENT, 1, 8)], 0, 8)
    r1 = call_events([(2, POST_RECV, 0, 8), (8, RECEIVED, 0, 8)], 5, 8)
    b = critical_path([r0, r1], NET)
    assert (b.total, b.skew, b.wire, b.transport, b.software) == (8, 2, 1, 5, 0)
    assert b.skew + b.wire + b.transport + b.software == b.total


def test_a_backend_collective_waits_for_the_last_rank_to_post():
    """Top-k's all-gather: rank 2 posts last (at 7), everyone holds the result at 9."""
    ranks = [
        [(s, START, 0, 0), (p, POST_COLL, 0, 8), (9, COLL_DONE, 0, 8), (9, END, 0, 0)]
        for s, p in ((0, 1), (2, 3), (4, 7))
    ]
    b = critical_path(ranks, NET, collective_wire=1.5)
    assert (b.total, b.span, b.skew, b.wire, b.transport, b.software) == (9, 5, 4, 1.5, 0.5, 3)


def test_events_off_one_clock_or_unframed_are_refused():
    r0 = [(0, START, 0, 0), (0, POST_RECV, 1, 8), (1, RECEIVED, 1, 8), (1, END, 0, 0)]
    r1 = [(0, START, 0, 0), (3, POST_SEND, 0, 8), (4, SENT, 0, 8), (4, END, 0, 0)]  # posted after r0 got it
    with pytest.raises(ValueError, match="one clock"):
        critical_path([r0, r1], NET)
    with pytest.raises(ValueError, match="one 'start'"):
        critical_path([r0[1:], r1], NET)
    with pytest.raises(ValueError, match="one 'start'"):  # only receives posted early come before it
        critical_path([[r1[1], r0[0], *r0[2:]], r1], NET)


@pytest.mark.parametrize(
    "override,names",
    [
        ("nodes=[1,2]", "nodes="),
        ("nodes=4", "nodes="),
        ("m=[0]", "m="),
        ("steps=0", "steps="),
        ("warmup=-1", "warmup="),
        ("density=2", "density="),
        ("+reducers.bad={_target_:os.system}", "reducers.bad"),
        ("profile=/nonexistent/profile.json", "profile="),
        ("realtime=yes", "realtime="),
        ("pingpong.sizes=[8]", "pingpong.sizes="),
        ("pingpong.reps=0", "pingpong.reps="),
        ("cluster=emulated realtime=true", "dilation"),
    ],
)
def test_tracerun_refuses_bad_settings_in_one_line(override, names):
    from hydra import compose, initialize_config_dir

    from gtopk.perf.tracerun import check
    from gtopk.run.settings import ConfigError
    from tests.config import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        check(compose("trace", overrides=[]))  # the defaults pass
        cfg = compose("trace", overrides=override.split())
    with pytest.raises(ConfigError, match=names) as e:
        check(cfg)
    assert "\n" not in str(e.value)
