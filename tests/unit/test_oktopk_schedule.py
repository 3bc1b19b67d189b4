"""Ok-Topk's schedule as it runs, every rank of P in one process (the recorded world,
``gtopk.perf.virtualworld``: the reducer's own code over a stand-in for torch.distributed),
against the specification and the cost model: the point-to-point messages (partners and
sizes) against ``OkTopKSpec.messages``, each rank's record against the bytes of the
tensors it passed to the collectives (padding told apart by its sentinel index) and
against ``oktopk_cost.rank_traffic``, the critical path against the model, the update and
residuals against the spec. Up to P = 64 here; 128 and 1,024 in the slow tier.

``python -m tests.unit.test_oktopk_schedule [P ...]`` prints the table of docs/oktopk.md."""

from __future__ import annotations

import copy
import sys
import time
from collections import Counter
from dataclasses import dataclass

import pytest
import torch

import gtopk.reducers.oktopk.comm as oktopk_comm
from gtopk.perf.virtualworld import BYTES, ROUNDS, RecordedWorld
from gtopk.reducers.costmodel import Network, Traffic, dense_traffic
from gtopk.reducers.oktopk import OkTopKReducer
from gtopk.reducers.oktopk.cost import entry_bytes, p2p_time, rank_traffic
from gtopk.reducers.oktopk.reference import OkTopKSpec
from gtopk.reducers.oktopk.regions import SENTINEL
from gtopk.reducers.selection.exact import k_for

M, DENSITY = 1000, 0.004  # k = 4, as gtopk.perf.schedulecheck
MIXED = Network(alpha=1.0, beta=0.25)
NETS = (ROUNDS, BYTES, MIXED)
#: exact steps 0 and 2, regions at 0 and 3: every kind of step within four
PERIODS = {"threshold_period": 2, "boundary_period": 3}


@dataclass
class Recorded:
    """What a recorded world recorded (not the world itself: it holds every rank's buffers)."""

    messages: list
    collectives: list
    clocks: list


@dataclass
class Step:
    P: int
    m: int
    exact: bool
    boundary: bool
    world: Recorded
    spec: OkTopKSpec
    records: list
    wires: list
    updates: list
    residuals: list
    want: tuple
    blocks: list  # (rank, tensor) of every all_gather input


def random_grads(P: int, m: int, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * it + P)
    return [torch.randn(m, generator=g) for _ in range(P)]


def record(P: int, steps: int = 4, m: int = M, density: float = DENSITY, grads=random_grads) -> list[Step]:
    """``steps`` reduces of every rank of a recorded P-rank world, beside the spec."""
    reducers: list = [None] * P
    spec = OkTopKSpec(P, density, **PERIODS)
    residuals = [torch.zeros(m) for _ in range(P)]
    out = []
    for it in range(steps):
        g = grads(P, m, it)
        world, blocks = RecordedWorld(P, nets=NETS), []
        gather = world.all_gather

        def spy(tensor_list, tensor, group=None, async_op=False, gather=gather, blocks=blocks, world=world):
            blocks.append((world.rank, tensor.clone()))
            return gather(tensor_list, tensor, group, async_op)

        world.all_gather = spy

        def rank_fn(rank: int, g=g):
            if reducers[rank] is None:  # built inside the world: P ranks
                reducers[rank] = OkTopKReducer(density, **PERIODS)
            return reducers[rank].reduce(g[rank].clone())

        results = world.run(rank_fn)
        exact = spec.t % PERIODS["threshold_period"] == 0
        boundary = spec.t % PERIODS["boundary_period"] == 0
        want = spec.step([r + x for r, x in zip(residuals, g)])
        residuals = want[1]
        out.append(
            Step(
                P,
                m,
                exact,
                boundary,
                Recorded(world.messages, world.collectives, world.clocks),
                copy.deepcopy(spec),  # this step's selections and regions
                [r for _, r in results],
                [r.wire for r in reducers],
                [u for u, _ in results],
                [r.feedback.residual.clone() for r in reducers],
                want,
                blocks,
            )
        )
    return out


def nominal(P: int, kind: str, nbytes: int) -> Traffic:
    """A backend collective's traffic as the records count it (the rings gloo runs)."""
    if kind == "all_gather" and P > 1:
        return Traffic(P - 1, (P - 1) * nbytes, (P - 1) * nbytes)
    if kind == "all_reduce":
        return dense_traffic(P, [nbytes // 8], 8)
    return Traffic()


def check(step: Step) -> list[str]:
    """Every disagreement of one recorded step with the spec and the model."""
    P, m, spec, world, bad = step.P, step.m, step.spec, step.world, []
    e = entry_bytes(m)
    if any(not torch.equal(u, step.want[0]) for u in step.updates):
        bad.append("an update differs from the spec's")
    if any(not torch.equal(r, w) for r, w in zip(step.residuals, step.want[1])):
        bad.append("a residual differs from the spec's")
    have = Counter((x.src, x.dst, x.nbytes) for x in world.messages)
    want = Counter({(s, d, n * e): c for (s, d, n), c in spec.messages().items()})
    if have != want:
        bad.append(f"messages: extra {list(have - want)[:4]}, missing {list(want - have)[:4]}")
    # each rank's record against what it did: point-to-point as sent, collectives as rings
    counts = [[0] * P for _ in range(P)]
    for i, sel in enumerate(spec.last["sels"]):
        for j in sel:
            counts[i][spec.region(j)] += 1
    held = spec.last["union"] if step.exact else spec.last["final"]
    sizes = [sum(1 for j in held if spec.region(j) == r) for r in range(P)]
    for rank, (rec, wire) in enumerate(zip(step.records, step.wires)):
        sent = [x for x in world.messages if x.src == rank]
        t = Traffic(len(sent), sum(x.nbytes for x in sent), sum(x.nbytes for x in world.messages if x.dst == rank))
        passed = sum(x.nbytes for x in sent)
        for c in world.collectives:
            if c.rank == rank:
                t = t + nominal(P, c.kind, c.nbytes)
                passed += c.nbytes
        got = (rec.messages_sent, rec.bytes_sent, rec.bytes_recv)
        if got != (t.messages_sent, t.bytes_sent, t.bytes_recv):
            bad.append(f"rank {rank}: record {got}, what it did {t}")
        model, model_wire = rank_traffic(rank, P, m, counts, sizes, step.boundary and P > 1)
        if got != (model.messages_sent, model.bytes_sent, model.bytes_recv) or wire != model_wire:
            bad.append(f"rank {rank}: record {got} {wire}, rank_traffic {model} {model_wire}")
        padding = sum(
            e * int((b[: b.numel() // e * 4].view(torch.int32) == SENTINEL).sum())
            for r, b in step.blocks
            if r == rank and b.dtype == torch.uint8
        )
        if (wire.payload + wire.padding + wire.meta, wire.padding) != (passed, padding):
            bad.append(f"rank {rank}: wire {wire}, tensors passed {passed} bytes with {padding} of padding")
        if rec.payload_bytes != wire.payload:
            bad.append(f"rank {rank}: payload_bytes {rec.payload_bytes}, wire {wire.payload}")
    rounds = max(c[0] for c in world.clocks)
    if rounds > 2 * (P - 1):  # two phases of at most P - 1 rotation steps
        bad.append(f"{rounds} messages on the critical path, more than 2(P - 1)")
    return bad


SMALL = (1, 2, 3, 4, 5, 7, 8, 16, 33)  # and 64, 128, 1,024 in the slow tier


@pytest.mark.parametrize("P", SMALL)
def test_schedule_as_run_matches_the_spec_and_the_records(P):
    steps = record(P)
    for it, step in enumerate(steps):
        assert check(step) == [], f"step {it}"
    if P > 1:
        assert any(s.world.messages for s in steps)


def balanced_grads(P: int, m: int, it: int) -> list[torch.Tensor]:
    """Every rank holds the same k large entries, k / P in each of P equal slices of m, and
    nothing else: every selection, region and global set is exactly the balanced case."""
    k = k_for(DENSITY_BALANCED, m)
    g = torch.zeros(m)
    where = torch.cat([torch.arange(k // P) + r * (m // P) for r in range(P)])
    g[where] = torch.arange(1, k + 1, dtype=torch.float32)
    return [g.clone() for _ in range(P)]


DENSITY_BALANCED = 0.064  # k = 64 of 1,000: k / P entries per region for P | 64


@pytest.mark.parametrize("P", [2, 4, 8, 16])
def test_balanced_case_is_the_model_and_under_the_paper_s_bound(P):
    """With the paper's assumptions met, the critical path is the model's ``p2p_time``
    exactly (the backend all-gathers are not run in the recorded world), and each rank's
    entries sent stay below 6k (P - 1) / P words."""
    k = k_for(DENSITY_BALANCED, M)
    steps = record(P, steps=3, density=DENSITY_BALANCED, grads=balanced_grads)
    for step in steps:
        assert check(step) == []
        path = tuple(max(c[i] for c in step.world.clocks) for i in range(len(NETS)))
        assert path == tuple(p2p_time(P, k, M, net) for net in NETS)
        for wire in step.wires:
            assert wire.padding == 0 and wire.payload / 4 <= 6 * k * (P - 1) / P


def test_an_unbalanced_gather_is_caught(monkeypatch):
    """Gathering each rank's entries padded to the largest count, without the balancing
    moves, gives the same update but neither the spec's messages nor its padding."""

    def unbalanced(self, idx, val):
        return self.gather_entries(idx, val, int(self.gather_counts([idx.numel()]).max()))

    monkeypatch.setattr(oktopk_comm.Comm, "gather_balanced", unbalanced)
    problems = [p for step in record(8) for p in check(step)]
    assert not any("spec's" in p for p in problems)  # the same updates and residuals
    assert any(p.startswith("messages:") for p in problems)
    assert any("rank_traffic" in p for p in problems)


@pytest.mark.slow
@pytest.mark.parametrize("P", [64, 128, 1024])
def test_schedule_as_run_up_to_1024(P):
    for it, step in enumerate(record(P, steps=2)):
        assert check(step) == [], f"step {it}"


def main(argv: list[str]) -> None:
    print(f"m = {M}, k = {k_for(DENSITY, M)}, steps: exact + regions, re-used thresholds")
    print(f"{'P':>5} {'step':>6} {'messages':>8} {'bytes':>9} {'path msgs':>9} {'path bytes':>10} {'s':>6}  check")
    for P in [int(a) for a in argv] or [2, 3, 8, 64, 128, 1024]:
        t0 = time.perf_counter()
        steps = record(P, steps=2)
        seconds = time.perf_counter() - t0
        for step in steps:
            msgs = step.world.messages
            path = [max(c[i] for c in step.world.clocks) for i in range(2)]
            print(
                f"{P:>5} {'exact' if step.exact else 'reuse':>6} {len(msgs):>8} {sum(x.nbytes for x in msgs):>9} "
                f"{path[0]:>9g} {path[1]:>10g} {seconds / 2:>6.1f}  {'; '.join(check(step)) or 'ok'}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
