"""The reducers' schedules as they run, at any P, against the cost model.

``record(case, P)`` runs one ``reduce`` of the case's reducer as every rank of a P-rank
group in one process (``gtopk.perf.recorder.RecordedWorld``: the reducers' own code over a
stand-in for ``torch.distributed``) and ``check(rec)`` compares what it recorded with
``gtopk.reducers.costmodel``:

* point-to-point schedules (gTop-k): every message's partners (the binomial tree's edges,
  recursive doubling's folds and exchanges, each message its rule's size), each rank's
  messages and bytes sent and received (``costmodel.*_traffic``, and the reducer's own
  ``ReduceRecord``), the messages on the critical path (the reducer's ``predict_commu``
  with alpha = 1, beta = 0), its bytes (alpha = 0, beta = 1) and its time where both
  count (``MIXED``), and that every rank sends and receives;
* backend collectives (dense, Top-k): every rank makes the same calls, of the sizes the
  model's formula takes (one all-gather of k entries; one all-reduce per bucket), and its
  record carries the model's nominal traffic; what the backend does inside is not run;
* the data: every rank's update is the same, and equals ``gtopk.reducers.reference``'s
  (``reference_upto``: up to that P, as the reference is slow).

``python -m gtopk.perf.schedulecheck [--P 2 3 ... 4096] [--case ...]`` prints the table.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gtopk.perf.recorder import BYTES, ROUNDS, RecordedWorld
from gtopk.reducers import DenseReducer, GTopKReducer, ReduceRecord, TopKReducer, reference
from gtopk.reducers import costmodel as cm
from gtopk.reducers.costmodel import Network
from gtopk.reducers.selection import k_for

M, DENSITY = 1000, 0.004  # k = 4: P = 4096 stays cheap; any m, k would do
#: a clock on which bytes weigh beside latency (k = 4: a 32-byte message costs 1 + 8)
MIXED = Network(alpha=1.0, beta=0.25)
NETS = (ROUNDS, BYTES, MIXED)
BACKEND_CALLS = ("all_gather", "all_reduce")  # a collective whose inside is the backend's


@dataclass(frozen=True)
class Case:
    """A reducer class with its config settings; ``traffic(rank, P, k, m)`` the model's
    per-rank counts; ``spec(accs, k)`` the reference's (update, residuals); either
    ``edges(P, k, m)``, the point-to-point messages (src, dst, bytes) its schedule's rules
    give, or ``calls(P, k, m)``, the backend collectives (kind, bytes per rank) the
    model's formula takes; ``largest_P`` the largest P worth recording (None: any)."""

    cls: type
    settings: dict
    traffic: Callable
    spec: Callable
    edges: Callable | None = None
    calls: Callable | None = None
    largest_P: int | None = None


def tree_edges(P: int, up: int, down: int) -> Counter:
    """The binomial tree: rank i > 0 sends ``up`` bytes to i - lowbit(i), which sends it ``down`` bytes back."""
    return Counter({e: 1 for i in range(1, P) for e in ((i, i - (i & -i), up), (i - (i & -i), i, down))})


def rd_edges(P: int, nbytes: int, back: int) -> Counter:
    """Recursive doubling with folding: i >= P2 sends to i - P2 and gets ``back`` bytes
    back; the ranks below P2 exchange with i XOR 2^s."""
    P2 = 1 << (P.bit_length() - 1)
    c = Counter({(i, i ^ s, nbytes): 1 for i in range(P2) for s in (1 << b for b in range(P2.bit_length() - 1))})
    for e in range(P2, P):
        c[(e, e - P2, nbytes)] += 1
        c[(e - P2, e, back)] += 1
    return c


def gtopk_edges(algorithm: str, putback: str):
    def edges(P: int, k: int, m: int) -> Counter:
        entry, idx = k * (cm.index_bytes(m) + cm.VALUE_BYTES), k * cm.index_bytes(m)
        final = entry if putback == "index" else idx
        c = tree_edges(P, entry, final) if algorithm == "tree" else rd_edges(P, entry, final)
        return c + rd_edges(P, k * cm.VALUE_BYTES, k * cm.VALUE_BYTES) if putback == "exact" else c

    return edges


def _gtopk_case(algorithm: str, putback: str) -> Case:
    return Case(
        GTopKReducer,
        {"algorithm": algorithm, "putback": putback},
        lambda rank, P, k, m: cm.gtopk_traffic(rank, P, k, m, algorithm, putback),
        lambda accs, k: reference.gtopk(accs, k, algorithm, putback),
        gtopk_edges(algorithm, putback),
    )


CASES: dict[str, Case] = {
    "gtopk tree": _gtopk_case("tree", "index"),
    "gtopk tree exact": _gtopk_case("tree", "exact"),
    "gtopk rd": _gtopk_case("recursive_doubling", "index"),
    "gtopk rd exact": _gtopk_case("recursive_doubling", "exact"),
    "topk": Case(  # each rank unpacks and adds all P parts: P^2 small ops for the world (P = 1024: ~20 s)
        TopKReducer,
        {},
        lambda rank, P, k, m: cm.topk_traffic(P, k, m),
        lambda accs, k: reference.topk(accs, k),
        calls=lambda P, k, m: [("all_gather", k * (cm.index_bytes(m) + cm.VALUE_BYTES))],
        largest_P=1024,
    ),
    "dense": Case(  # 1 KiB buckets: an m = 1000 gradient in four all-reduces
        DenseReducer,
        {"bucket_mb": 1 / 1024},
        lambda rank, P, k, m: cm.dense_traffic(P, DenseReducer(1 / 1024).bucket_sizes(m)),
        lambda grads, k: reference.dense(grads),
        calls=lambda P, k, m: [("all_reduce", n * cm.VALUE_BYTES) for n in DenseReducer(1 / 1024).bucket_sizes(m)],
    ),
}


@dataclass
class Recording:
    name: str
    P: int
    m: int
    density: float
    k: int
    grads: list[torch.Tensor]
    updates: list[torch.Tensor]
    records: list[ReduceRecord]
    world: RecordedWorld
    seconds: float


def record(name: str, P: int, m: int = M, density: float = DENSITY, seed: int = 0, eager: bool = False) -> Recording:
    """One ``reduce`` of case ``name`` on every rank of a recorded P-rank world (zero
    residual, rank i's gradient seeded with ``seed * P + i``; ``eager``: buffered sends,
    see ``RecordedWorld``)."""
    case = CASES[name]
    grads = [torch.randn(m, generator=torch.Generator().manual_seed(seed * P + i)) for i in range(P)]
    world = RecordedWorld(P, nets=NETS, eager=eager)

    def rank_fn(rank: int):
        reducer = case.cls(**case.settings, **({"density": density} if case.cls.uses_density else {}))
        return reducer.reduce(grads[rank].clone())

    t0 = time.perf_counter()
    out = world.run(rank_fn)
    seconds = time.perf_counter() - t0
    k = k_for(density, m) if case.cls.uses_density else m
    return Recording(name, P, m, density, k, grads, [u for u, _ in out], [r for _, r in out], world, seconds)


def critical_path(rec: Recording) -> tuple[float, ...]:
    """(messages, bytes, time on ``MIXED``) on the recorded critical path: the latest
    rank's clocks."""
    return tuple(max(c[i] for c in rec.world.clocks) for i in range(len(NETS)))


def predicted_path(rec: Recording) -> tuple[float, ...]:
    """The same by the reducer's own ``predict_commu`` (what the performance model uses)."""
    case = CASES[rec.name]
    settings = {**case.settings, **({"density": rec.density} if case.cls.uses_density else {})}
    return tuple(case.cls.predict_commu(rec.P, rec.m, net, **settings) for net in NETS)


def check(rec: Recording, reference_upto: int = 256) -> list[str]:
    """Every disagreement between the recording and the model (empty: none). With
    buffered sends (``eager``) the recorded critical path may be shorter than the
    model's, not longer."""
    case, P, k, m, bad = CASES[rec.name], rec.P, rec.k, rec.m, []
    msgs = rec.world.messages
    sent, recv = Counter(), Counter()
    sent_b, recv_b = Counter(), Counter()
    for x in msgs:
        sent[x.src] += 1
        recv[x.dst] += 1
        sent_b[x.src] += x.nbytes
        recv_b[x.dst] += x.nbytes
    backend = [c for c in rec.world.collectives if c.kind in BACKEND_CALLS]
    for rank, r in enumerate(rec.records):
        want = case.traffic(rank, P, k, m)
        got = (r.messages_sent, r.bytes_sent, r.bytes_recv)
        if got != (want.messages_sent, want.bytes_sent, want.bytes_recv):
            bad.append(f"rank {rank}: record {got}, model {want}")
        if case.edges is not None and (sent[rank], sent_b[rank], recv_b[rank]) != got:
            bad.append(f"rank {rank}: messages {(sent[rank], sent_b[rank], recv_b[rank])}, record {got}")
    if case.edges is not None:
        if backend:
            bad.append(f"a point-to-point schedule made backend collective calls: {backend[:3]}")
        have = Counter((x.src, x.dst, x.nbytes) for x in msgs)
        want_edges = case.edges(P, k, m)
        if have != want_edges:
            bad.append(
                f"messages differ from the rules: extra {list(have - want_edges)[:4]}, missing {list(want_edges - have)[:4]}"
            )
        idle = [r for r in range(P) if P > 1 and not (sent[r] and recv[r])]
        if idle:
            bad.append(f"ranks that neither send nor receive: {idle[:8]}")
        path, model = critical_path(rec), predicted_path(rec)
        wrong = any(a > b for a, b in zip(path, model)) if rec.world.eager else path != model
        if wrong:
            bad.append(f"critical path (messages, bytes, time) {path}, model {model}")
    else:
        if msgs:
            bad.append(f"a backend-collective reducer sent {len(msgs)} point-to-point messages")
        calls = {r: [(c.kind, c.nbytes) for c in backend if c.rank == r] for r in range(P)}
        if P > 1 and any(calls[r] != calls[0] for r in range(P)):
            bad.append("ranks made different backend collective calls")
        want_calls = case.calls(P, k, m)
        if P > 1 and calls[0] != want_calls:
            bad.append(f"collective calls {calls[0][:4]}, model's {want_calls[:4]}")
    if any(not torch.equal(u, rec.updates[0]) for u in rec.updates):
        bad.append("the ranks' updates differ")
    if P <= reference_upto:
        want, _ = case.spec(rec.grads, k)
        if not torch.allclose(rec.updates[0], want, rtol=1e-5, atol=1e-6) or (
            case.cls.uses_density and not torch.equal(rec.updates[0], want)
        ):
            bad.append("the update differs from gtopk.reducers.reference's")
    return bad


SWEEP = (2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 64, 128, 256, 512, 1000, 1024, 2048, 4095, 4096)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--P", type=int, nargs="+", default=list(SWEEP), help="group sizes")
    ap.add_argument("--eager", action="store_true", help="buffered sends (the model is then an upper bound)")
    ap.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES), help="reducers")
    ap.add_argument(
        "--reference-upto", type=int, default=256, help="compare the update with the reference up to this P"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"m = {M}, k = {k_for(DENSITY, M)}; per rank: max messages sent; path: critical path (recorded / model)")
    print(
        f"{'case':17} {'P':>5} {'messages':>8} {'bytes':>9} {'max/rank':>8} {'path msgs':>11} {'path bytes':>13} {'s':>6}  check"
    )
    failed = 0
    for name in args.case:
        for P in args.P:
            if CASES[name].largest_P is not None and P > CASES[name].largest_P:
                print(f"{name:17} {P:>5}  not recorded: above {CASES[name].largest_P} (see CASES)")
                continue
            rec = record(name, P, eager=args.eager)
            problems = check(rec, args.reference_upto)
            failed += bool(problems)
            (rm, rb, _), (pm, pb, _) = critical_path(rec), predicted_path(rec)
            n = len(rec.world.messages)
            path_m = f"{rm:g}/{pm:g}" if CASES[name].edges else f"-/{pm:g}"
            path_b = f"{rb:g}/{pb:g}" if CASES[name].edges else f"-/{pb:g}"
            top = max(r.messages_sent for r in rec.records)
            print(
                f"{name:17} {P:>5} {n:>8} {sum(x.nbytes for x in rec.world.messages):>9} {top:>8} "
                f"{path_m:>11} {path_b:>13} {rec.seconds:>6.2f}  {'ok' if not problems else '; '.join(problems)}"
            )
    if failed:
        raise SystemExit(f"{failed} recordings disagree with the model")


if __name__ == "__main__":
    main()
