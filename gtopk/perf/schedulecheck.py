"""Every reducer's schedule as it runs, at any P, against its own cost model.

The reducers are discovered, not listed: ``discover()`` reads every ``conf/reducer/*.yaml``
(its ``_target_`` class and settings; ``case(name, **overrides)`` one of them with other
settings, e.g. gTop-k's ``algorithm=recursive_doubling``). ``record(case, P)`` runs one
``reduce`` of that class as every rank of a P-rank group in one process
(``gtopk.perf.virtualworld.RecordedWorld``: the reducer's own code over a stand-in for
``torch.distributed``) and ``check(rec)`` compares what the calls did with the model:

* the critical path, from the calls the reducer made (not from what it reports): the
  point-to-point messages as they were matched, and each backend collective call at the
  textbook time of its kind and size (``backend_cost``: a ring all-reduce, a ring
  all-gather), on three networks: messages (alpha = 1, beta = 0), bytes (alpha = 0,
  beta = 1) and both (``MIXED``), against the class's ``predict_commu`` with the case's
  settings (what the performance model uses). A class may state a relative tolerance for
  a model that assumes balanced data (``schedule_tolerance``; default 0: equal);
* each rank's ``ReduceRecord`` traffic against what its calls carried (its point-to-point
  messages, plus the nominal traffic of its backend calls);
* where a class's schedule has written rules (``RULES``: gTop-k's tree and recursive
  doubling), every message's partners and size against them, and every rank takes part;
* the data: every rank's update is the same and equals the class's own ``reference``
  (``reference_upto``: up to that P, as references are slow), bit for bit for the reducers
  that select (``uses_density``), to float rounding for the rest (``same_update``).

A class without a cost model, or whose communication runs inside backward (DDP's hooks,
``overlaps_backward``: ``reduce`` makes no call), is not recordable: ``Case.skip`` says why.

``python -m gtopk.perf.schedulecheck [--P 2 3 ... 4096] [--case ...]`` prints the table.
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from omegaconf import OmegaConf

from gtopk.perf import model as perfmodel
from gtopk.perf.virtualworld import BYTES, ROUNDS, RecordedWorld
from gtopk.reducers import GTopKReducer, ReduceRecord
from gtopk.reducers import costmodel as cm
from gtopk.reducers.costmodel import Network, Traffic
from gtopk.reducers.selection.exact import k_for

M, DENSITY = 1000, 0.004  # k = 4: P = 4096 stays cheap; any m, k would do
#: a clock on which bytes weigh beside latency (k = 4: a 32-byte message costs 1 + 8)
MIXED = Network(alpha=1.0, beta=0.25)
NETS = (ROUNDS, BYTES, MIXED)
BACKEND_CALLS = ("all_gather", "all_reduce")  # a collective whose inside is the backend's


@dataclass(frozen=True)
class Case:
    """A ``conf/reducer`` config: ``name`` (the yaml's, with any overrides shown), its class
    and its settings (density excluded: ``record`` passes it to the classes that use it);
    ``skip``: why its schedule cannot be recorded (None: it can)."""

    name: str
    cls: type
    settings: dict = field(default_factory=dict)
    skip: str | None = None

    def build(self, density: float):
        """Local (a process group, or the recorded world, decides the ranks)."""
        return self.cls(**self.settings, **({"density": density} if self.cls.uses_density else {}))

    def predict(self, P: int, m: int, net: Network, density: float) -> float:
        """The model of the recorded call: step 0 of a fresh run where the class's model
        takes a ``step`` (a reducer whose steps differ, e.g. Ok-Topk's exact and re-used
        thresholds), else its one cost."""
        step = {"step": 0} if "step" in inspect.signature(self.cls.predict_commu).parameters else {}
        return self.cls.predict_commu(P, m, net, **self.settings, density=density, **step)


def _skip(cls: type, settings: dict) -> str | None:
    if cls.overlaps_backward:
        return "communicates inside backward (DDP's hooks, overlaps_backward): reduce makes no call to record"
    try:
        cls.predict_commu(2, M, ROUNDS, **settings, density=DENSITY)
    except NotImplementedError:
        return "declares no cost model (predict_commu)"
    return None


def case(name: str, **overrides) -> Case:
    """``conf/reducer/<name>.yaml`` with ``overrides`` of its settings."""
    node = OmegaConf.to_container(OmegaConf.load(perfmodel.CONF / "reducer" / f"{name}.yaml"), resolve=False)
    cls = perfmodel.reducer_class(node)
    settings = {k: v for k, v in node.items() if k not in ("_target_", "density")}
    settings = {k: v for k, v in settings.items() if not (isinstance(v, str) and v.startswith("${"))}
    settings.update(overrides)
    shown = name + ("[" + ",".join(f"{k}={v}" for k, v in sorted(overrides.items())) + "]" if overrides else "")
    return Case(shown, cls, settings, _skip(cls, settings))


def discover() -> dict[str, Case]:
    """Every ``conf/reducer/*.yaml``, by name."""
    return {p.stem: case(p.stem) for p in sorted((perfmodel.CONF / "reducer").glob("*.yaml"))}


def backend_cost(kind: str, nbytes: int, word: int, P: int, net: Network) -> float:
    """The textbook time of one backend collective call (what ``gtopk.reducers.costmodel``
    takes gloo and NCCL to run): a ring all-reduce of ``nbytes / word`` elements, a ring
    all-gather of ``nbytes`` per rank; the first call's size check (``all_gather_object``)
    and timing barriers are outside the model."""
    if P == 1:
        return 0.0
    if kind == "all_reduce":
        return cm.ring_time(P, nbytes // word, net, word)
    if kind == "all_gather":
        return (P - 1) * net.msg(nbytes)
    return 0.0


def backend_traffic(kind: str, nbytes: int, word: int, P: int) -> Traffic:
    """The nominal per-rank traffic of one backend call (``backend_cost``'s algorithms)."""
    if P == 1 or kind not in BACKEND_CALLS:
        return Traffic()
    if kind == "all_reduce":
        return cm.dense_traffic(P, [nbytes // word], word)
    return Traffic(P - 1, (P - 1) * nbytes, (P - 1) * nbytes)


def same_update(cls: type, got: torch.Tensor, want: torch.Tensor) -> bool:
    """The kit's tolerance: bit for bit for a reducer that selects (its sums are its own
    code's, in a fixed order), float rounding (rtol 1e-5, atol 1e-6) for one whose update
    is a backend all-reduce's sum (summed in the backend's order); a class may state its
    own (``tolerance``: (rtol, atol))."""
    tol = cls.tolerance
    if tol is None and cls.uses_density:
        return torch.equal(got, want)
    rtol, atol = tol if tol is not None else (1e-5, 1e-6)
    return got.shape == want.shape and torch.allclose(got, want, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- written rules (gTop-k)
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


def gtopk_edges(settings: dict, P: int, k: int, m: int) -> Counter:
    """gTop-k's messages (src, dst, bytes) by its schedule's rules (docs/reducers.md)."""
    algorithm, putback = settings.get("algorithm", "tree"), settings.get("putback", "index")
    entry, idx = k * (cm.index_bytes(m) + cm.VALUE_BYTES), k * cm.index_bytes(m)
    final = entry if putback == "index" else idx
    c = tree_edges(P, entry, final) if algorithm == "tree" else rd_edges(P, entry, final)
    return c + rd_edges(P, k * cm.VALUE_BYTES, k * cm.VALUE_BYTES) if putback == "exact" else c


#: class -> its schedule's written rules, ``edges(settings, P, k, m)``: an extra check where
#: written (the cost model, the records and the reference are checked for every class)
RULES: dict[type, Callable[[dict, int, int, int], Counter]] = {GTopKReducer: gtopk_edges}


@dataclass
class Recording:
    case: Case
    P: int
    m: int
    density: float
    k: int
    grads: list[torch.Tensor]
    updates: list[torch.Tensor]
    records: list[ReduceRecord]
    world: RecordedWorld
    seconds: float


def record(
    c: Case | str, P: int, m: int = M, density: float = DENSITY, seed: int = 0, eager: bool = False
) -> Recording:
    """One ``reduce`` of case ``c`` on every rank of a recorded P-rank world (zero
    residual, rank i's gradient seeded with ``seed * P + i``; ``eager``: buffered sends,
    see ``RecordedWorld``)."""
    c = case(c) if isinstance(c, str) else c
    if c.skip:
        raise ValueError(f"{c.name}: {c.skip}")
    grads = [torch.randn(m, generator=torch.Generator().manual_seed(seed * P + i)) for i in range(P)]
    world = RecordedWorld(P, nets=NETS, eager=eager, collective_cost=backend_cost)

    def rank_fn(rank: int):
        return c.build(density).reduce(grads[rank].clone())

    t0 = time.perf_counter()
    out = world.run(rank_fn)
    seconds = time.perf_counter() - t0
    k = k_for(density, m) if c.cls.uses_density else m
    return Recording(c, P, m, density, k, grads, [u for u, _ in out], [r for _, r in out], world, seconds)


def critical_path(rec: Recording) -> tuple[float, ...]:
    """(messages, bytes, time on ``MIXED``) on the recorded critical path, backend calls
    included at ``backend_cost``: the latest rank's clocks."""
    return tuple(max(c[i] for c in rec.world.clocks) for i in range(len(NETS)))


def predicted_path(rec: Recording) -> tuple[float, ...]:
    """The same by the class's own ``predict_commu`` (what the performance model uses)."""
    return tuple(rec.case.predict(rec.P, rec.m, net, rec.density) for net in NETS)


def _close(got: float, want: float, rtol: float) -> bool:
    return abs(got - want) <= rtol * abs(want) + 1e-9


def check(rec: Recording, reference_upto: int = 256) -> list[str]:
    """Every disagreement between the recording and the model (empty: none). With
    buffered sends (``eager``) the recorded critical path may be shorter than the
    model's, not longer."""
    c, P, k, m, bad = rec.case, rec.P, rec.k, rec.m, []
    sent, sent_b, recv, recv_b = Counter(), Counter(), Counter(), Counter()
    for x in rec.world.messages:
        sent[x.src], sent_b[x.src] = sent[x.src] + 1, sent_b[x.src] + x.nbytes
        recv[x.dst], recv_b[x.dst] = recv[x.dst] + 1, recv_b[x.dst] + x.nbytes
    backend = [x for x in rec.world.collectives if x.kind in BACKEND_CALLS]
    for rank, r in enumerate(rec.records):
        calls = Traffic(sent[rank], sent_b[rank], recv_b[rank])
        for x in backend:
            if x.rank == rank:
                calls = calls + backend_traffic(x.kind, x.nbytes, x.word, P)
        got = (r.messages_sent, r.bytes_sent, r.bytes_recv)
        if got != (calls.messages_sent, calls.bytes_sent, calls.bytes_recv):
            bad.append(f"rank {rank}: record {got}, its calls {calls}")
    if P > 1 and any(
        [(x.kind, x.nbytes) for x in backend if x.rank == r] != [(x.kind, x.nbytes) for x in backend if x.rank == 0]
        for r in range(P)
    ):
        bad.append("ranks made different backend collective calls")
    rules = RULES.get(c.cls)
    if rules is not None:
        have = Counter((x.src, x.dst, x.nbytes) for x in rec.world.messages)
        want_edges = rules(c.settings, P, k, m)
        if have != want_edges:
            bad.append(
                f"messages differ from the rules: extra {list(have - want_edges)[:4]}, missing {list(want_edges - have)[:4]}"
            )
        idle = [r for r in range(P) if P > 1 and not (sent[r] and recv[r])]
        if idle:
            bad.append(f"ranks that neither send nor receive: {idle[:8]}")
    path, model = critical_path(rec), predicted_path(rec)
    rtol = float(c.cls.schedule_tolerance)
    if rec.world.eager:
        wrong = any(a > b * (1 + rtol) + 1e-9 for a, b in zip(path, model))
    else:
        wrong = not all(_close(a, b, rtol) for a, b in zip(path, model))
    if wrong:
        bad.append(f"critical path (messages, bytes, time) {path}, model {model}")
    if any(not torch.equal(u, rec.updates[0]) for u in rec.updates):
        bad.append("the ranks' updates differ")
    if P <= reference_upto and c.cls.reference is not None:
        want, _ = c.build(rec.density).reference(rec.grads, None)
        if not same_update(c.cls, rec.updates[0], want):
            bad.append("the update differs from the class's reference")
    return bad


SWEEP = (2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 64, 128, 256, 512, 1000, 1024, 2048, 4095, 4096)


def main(argv: list[str] | None = None) -> None:
    cases = discover()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--P", type=int, nargs="+", default=list(SWEEP), help="group sizes")
    ap.add_argument("--eager", action="store_true", help="buffered sends (the model is then an upper bound)")
    ap.add_argument("--case", nargs="+", default=list(cases), choices=list(cases), help="conf/reducer configs")
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
        c = cases[name]
        if c.skip:
            print(f"{name:17}  not recorded: {c.skip}")
            continue
        for P in args.P:
            rec = record(c, P, eager=args.eager)
            problems = check(rec, args.reference_upto)
            failed += bool(problems)
            (rm, rb, _), (pm, pb, _) = critical_path(rec), predicted_path(rec)
            n = len(rec.world.messages)
            top = max(r.messages_sent for r in rec.records)
            print(
                f"{name:17} {P:>5} {n:>8} {sum(x.nbytes for x in rec.world.messages):>9} {top:>8} "
                f"{f'{rm:g}/{pm:g}':>11} {f'{rb:g}/{pb:g}':>13} {rec.seconds:>6.2f}  {'ok' if not problems else '; '.join(problems)}"
            )
    if failed:
        raise SystemExit(f"{failed} recordings disagree with the model")


if __name__ == "__main__":
    main()
