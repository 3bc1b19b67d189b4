"""The schedule check itself (``gtopk.perf.schedulecheck``, the recorded world): that it
catches a different schedule, a wrong model, a different wire format, deadlocks and
failing ranks; and gTop-k's schedules that no ``conf/reducer`` file names (recursive
doubling) at P = 1..64 (4,095 and 4,096 slow). Every ``conf/reducer`` config's schedule
is checked by the conformance kit (``tests/conformance/test_schedule.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import gtopk.reducers.gtopk as gtopk_module
import gtopk.reducers.topk as topk_module
from gtopk.perf import schedulecheck as sc
from gtopk.perf.cooperative import Deadlock
from gtopk.perf.virtualworld import BYTES, ROUNDS, RecordedWorld
from gtopk.reducers import costmodel as cm
from gtopk.reducers.wire import SparseCodec

SMALL = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 32, 33, 64)
LARGE = (128, 1024, 4095, 4096)  # and 1000, 2048 in `python -m gtopk.perf.schedulecheck`


#: name -> (conf/reducer config, overrides): gTop-k's schedules (its yaml files and recursive doubling)
VARIANTS = {
    "gtopk tree": ("gtopk", {}),
    "gtopk tree exact": ("gtopk_exact", {}),
    "gtopk rd": ("gtopk", {"algorithm": "recursive_doubling"}),
    "gtopk rd exact": ("gtopk_exact", {"algorithm": "recursive_doubling"}),
    "topk": ("topk", {}),
}


def case(name: str) -> sc.Case:
    conf, overrides = VARIANTS[name]
    return sc.case(conf, **overrides)


@pytest.mark.parametrize("P", SMALL)
@pytest.mark.parametrize("name", ["gtopk rd", "gtopk rd exact"])
def test_recursive_doubling_as_run_matches_the_model(name, P):
    rec = sc.record(case(name), P)
    assert sc.check(rec) == []
    if P > 1:  # the point-to-point schedule was recorded
        assert len(rec.world.messages) >= 2 * (P - 1)


@pytest.mark.parametrize("name", ["gtopk tree", "gtopk rd exact", "topk"])
@pytest.mark.parametrize("P,m,density", [(6, 5000, 0.01), (13, 300, 0.5)])
def test_other_sizes_of_k(name, P, m, density):
    """Message sizes follow k (50 and 150 entries here), not only the default k = 4."""
    assert sc.check(sc.record(case(name), P, m=m, density=density)) == []


@pytest.mark.slow
@pytest.mark.parametrize("name,P", [(n, P) for n in VARIANTS if n != "topk" for P in LARGE])
def test_gtopk_schedules_match_the_model_up_to_4096(name, P):
    rec = sc.record(case(name), P)
    assert sc.check(rec, reference_upto=1024) == []


def test_a_reducer_reporting_traffic_its_calls_did_not_carry_is_caught(monkeypatch):
    """Dense's record is written from a formula; the check counts the calls it made."""
    real = sc.cm.dense_traffic
    monkeypatch.setattr("gtopk.reducers.dense.dense_traffic", lambda P, sizes, *a: real(P, [*sizes, *sizes], *a))
    assert any("record" in p for p in sc.check(sc.record("dense", 4)))


def test_a_model_disagreeing_with_the_calls_is_caught(monkeypatch):
    """Top-k's model taking a recursive-doubling all-gather (log2 P rounds) where the
    reducer calls a ring all-gather (P - 1)."""
    monkeypatch.setattr("gtopk.reducers.topk.topk_time", lambda P, k, m, net: cm.log2_ceil(P) * net.msg(8 * k))
    assert any("critical path" in p for p in sc.check(sc.record("topk", 8)))


def test_a_different_schedule_is_caught(monkeypatch):
    """A star (every rank sends to rank 0) gives the same update but not the model's tree."""

    def star(p2p, rank, P, item, combine, msg, new_buf):
        if rank:
            p2p.send(msg.encode(item), 0)
            return None
        for src in range(1, P):
            item = combine(item, msg.decode(p2p.recv(new_buf(msg.nbytes), src)))
        return item

    monkeypatch.setattr(gtopk_module, "tree_reduce", star)
    monkeypatch.setattr(gtopk_module, "tree_reduce_first", lambda rank, P, nbytes: [])  # a star posts none early
    problems = sc.check(sc.record(case("gtopk tree"), 8))
    assert any("messages differ from the rules" in p for p in problems)
    assert any("critical path" in p for p in problems)


def test_a_model_with_log2_P_uncounted_is_caught(monkeypatch):
    """The paper's log2 P taken as floor for P = 5 would predict 4 messages, not 6."""

    def floor_model(P, k, m, net, algorithm, putback):
        lg = P.bit_length() - 1
        return 2 * lg * net.msg(k * 8)

    monkeypatch.setattr(gtopk_module, "gtopk_time", floor_model)
    assert any("critical path" in p for p in sc.check(sc.record(case("gtopk tree"), 5)))
    assert sc.check(sc.record(case("gtopk tree"), 8)) == []


def test_recorded_messages_carry_the_data_and_the_clocks():
    world = RecordedWorld(4, nets=(ROUNDS, BYTES))

    def chain(rank):  # 0 -> 1 -> 2 -> 3, each adding its rank
        buf = torch.zeros(2)
        if rank:
            dist.recv(buf, rank - 1)
        buf += rank
        if rank < 3:
            dist.send(buf, rank + 1)
        return buf

    out = world.run(chain)
    assert out[3].tolist() == [6.0, 6.0]
    assert [(x.src, x.dst, x.nbytes) for x in world.messages] == [(0, 1, 8), (1, 2, 8), (2, 3, 8)]
    assert [c for c in world.clocks] == [(1.0, 8.0), (2.0, 16.0), (3.0, 24.0), (3.0, 24.0)]
    assert dist.send is not world.send and not dist.is_initialized()  # the stand-in is gone


def test_a_deadlock_is_named_not_hung():
    def both_receive(rank):
        dist.recv(torch.zeros(1), 1 - rank)

    with pytest.raises(Deadlock, match="2 of 2 ranks wait forever.*rank 0: recv from 1"):
        RecordedWorld(2).run(both_receive)


def test_a_failing_rank_is_named_and_the_others_unwind():
    def mismatched(rank):
        if rank == 0:
            dist.send(torch.zeros(3), 1)
        elif rank == 1:
            dist.recv(torch.zeros(2), 0)
        else:
            dist.recv(torch.zeros(1), 0)  # waits forever: unwound

    with pytest.raises(RuntimeError, match="rank 1 of 3 failed.*sends 12 bytes to rank 1, which receives 8"):
        RecordedWorld(3).run(mismatched)


def test_ranks_disagreeing_on_a_collective_are_caught():
    def sizes(rank):
        dist.all_reduce(torch.zeros(1 + rank))

    with pytest.raises(RuntimeError, match="different sizes"):
        RecordedWorld(2).run(sizes)


def test_the_model_counts_what_runs_at_P_1024_by_formula_too():
    """The closed forms the performance model uses at P = 1,024 (tree, index put-back):
    2 log2 P messages of 8k bytes on the critical path, as recorded."""
    rec = sc.record(case("gtopk tree"), 1024)
    assert sc.critical_path(rec)[:2] == (20.0, 20 * 8 * rec.k)
    assert cm.gtopk_time(1024, rec.k, rec.m, ROUNDS, "tree", "index") == 20.0


@pytest.mark.parametrize("name", ["gtopk tree", "gtopk tree exact", "gtopk rd", "gtopk rd exact"])
def test_buffered_sends_never_take_longer_than_the_model(name):
    """gloo sends once the receiver has posted (the model is exact, above); a
    buffering transport lets the tree's last sender at P not a power of two deliver
    early: one round fewer than the model's ceil(log2 P) up and down (exact put-back:
    one or two, its sums starting earlier); recursive doubling: no difference."""
    for P in (2, 3, 5, 7, 8, 12, 33):
        rec = sc.record(case(name), P, eager=True)
        assert sc.check(rec) == []
        saved = sc.predicted_path(rec)[0] - sc.critical_path(rec)[0]
        if P & (P - 1) == 0 or "rd" in name:
            assert saved == 0, P
        else:
            assert saved in ((1,) if name == "gtopk tree" else (1, 2)), P


@pytest.mark.parametrize("name", ["topk", "gtopk rd"])
def test_a_wire_format_other_than_the_models_is_caught(name, monkeypatch):
    """int64 indices (the paper's code sends 16 bytes per entry) where the model says 8 bytes."""

    class WideCodec(SparseCodec):
        def __init__(self, k, m, device):
            super().__init__(k, m, device)
            self.index_dtype, self.index_nbytes = torch.int64, 8 * k
            self.nbytes = self.index_nbytes + 4 * k

    monkeypatch.setattr(topk_module, "SparseCodec", WideCodec)
    monkeypatch.setattr(gtopk_module, "SparseCodec", WideCodec)
    problems = sc.check(sc.record(case(name), 5))
    want = "critical path" if name == "topk" else "messages differ from the rules"
    assert any(want in p for p in problems), problems
