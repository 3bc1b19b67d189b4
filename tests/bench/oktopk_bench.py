"""Per-call time of Ok-Topk against gTop-k on loopback (gloo), medians; prints a table.

``python -m tests.bench.oktopk_bench [--P 2 4 8] [--models vgg16 resnet20] [--density 0.001]``
(``--fixed-gradient``: instead, what the re-used thresholds select under ``compute=replay``)

Each rank reduces a fresh standard-normal gradient per call, its residual cleared before
each call (outside the timing): every step then has the distribution of the first, the
stationary case in which a re-used threshold selects about k entries (with residuals
carried over, i.i.d. gradients would make step 0's threshold stale at once, which real
training does not do as fast: docs/oktopk.md). Ok-Topk is timed on steps with re-used
thresholds and on exact steps (step counter set to a multiple of the threshold period,
not of the boundary period), and its per-call time is their mix over one period:
``((tau' - 1) reuse + exact) / tau'``. gTop-k (tree, the paper's put-back) over the same
calls. A call is ``reduce`` as the training loop calls it, after a barrier; the time is
the slowest rank's. Collective (spawns P worker processes per P).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from gtopk.reducers.gtopk import GTopKReducer
from gtopk.reducers.oktopk import THRESHOLD_PERIOD, OkTopKReducer
from gtopk.reducers.selection.exact import k_for
from gtopk.run.spawn import spawn

SIZES = {"vgg16": 14_728_266, "resnet20": 269_722}


def _timed(reducer, grad: torch.Tensor) -> tuple[float, int, int]:
    """Collective: one reduce after a barrier; (slowest rank's seconds, selected, bytes sent)."""
    if reducer.feedback.residual is not None:
        reducer.feedback.residual.zero_()
    dist.barrier()
    t0 = time.perf_counter()
    _, rec = reducer.reduce(grad, out=grad)
    took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device="cpu")
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took), rec.selected, rec.bytes_sent


def bench(rank: int, P: int, m: int, density: float, reuse: int, exact: int) -> dict:
    """Worker: one warm-up call each, then ``reuse`` + ``exact`` timed calls per reducer."""
    g = torch.Generator().manual_seed(rank)
    grads = [torch.randn(m, generator=g) for _ in range(2)]
    out = {}
    for name, reducer in (("gtopk", GTopKReducer(density)), ("oktopk", OkTopKReducer(density))):
        _timed(reducer, grads[0].clone())  # step 0: exact, regions
        runs = {"reuse": [], "exact": []}
        for i in range(reuse + exact):
            kind = "reuse" if i < reuse else "exact"
            if name == "oktopk" and kind == "exact":
                reducer.step = THRESHOLD_PERIOD * (1 + 2 * i)  # an exact step without new regions
            runs[kind].append(_timed(reducer, grads[i % 2].clone()))
        out[name] = runs
    return out


def fixed_gradient(m: int, P: int, density: float, steps: int = 10) -> list[tuple[float, int]]:
    """Local (P ranks in one process, ``reduce_group``): each rank's gradient the same
    vector every step, as ``compute=replay`` makes it (scale 1e-3); per step, the mean
    selected / k and the entries the update writes."""
    k = k_for(density, m)
    grads = [1e-3 * torch.randn(m, generator=torch.Generator().manual_seed(i)) for i in range(P)]
    workers = [OkTopKReducer(density) for _ in range(P)]
    out = []
    for _ in range(steps):
        update, recs = OkTopKReducer.reduce_group(workers, [g.clone() for g in grads])
        out.append((sum(r.selected for r in recs) / P / k, int(torch.count_nonzero(update))))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--P", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--models", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--reuse", type=int, default=5, help="timed calls with re-used thresholds")
    ap.add_argument("--exact", type=int, default=3, help="timed exact calls")
    ap.add_argument(
        "--fixed-gradient", action="store_true", help="instead: selected/k per step under a replay's fixed gradient"
    )
    args = ap.parse_args(argv)
    if args.fixed_gradient:
        for name in args.models:
            for P in args.P:
                steps = fixed_gradient(SIZES[name], P, args.density)
                print(name, P, " ".join(f"{s:.1f}k/{n}" for s, n in steps))
        return
    print(f"loopback gloo, density {args.density}, load average {os.getloadavg()[0]:.2f} at start")
    print(
        f"{'model':9} {'P':>2} {'reducer':7} {'reuse ms':>9} {'exact ms':>9} {'per call ms':>11} {'sel/k':>6} {'KB sent':>8}"
    )
    for name in args.models:
        m = SIZES[name]
        k = k_for(args.density, m)
        for P in args.P:
            out = spawn(bench, P, (m, args.density, args.reuse, args.exact), timeout=900)[0]
            for reducer, runs in out.items():
                med = {kind: 1e3 * statistics.median(t for t, _, _ in r) for kind, r in runs.items()}
                calls = runs["reuse"] + runs["exact"]
                if reducer == "oktopk":
                    per = ((THRESHOLD_PERIOD - 1) * med["reuse"] + med["exact"]) / THRESHOLD_PERIOD
                else:
                    per = 1e3 * statistics.median(t for t, _, _ in calls)
                sel = statistics.mean(s for _, s, _ in runs["reuse"]) / k
                sent = statistics.median(b for _, _, b in calls) / 1e3
                print(
                    f"{name:9} {P:>2} {reducer:7} {med['reuse']:>9.1f} {med['exact']:>9.1f} {per:>11.1f} "
                    f"{sel:>6.2f} {sent:>8.1f}"
                )
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
