"""``python -m tests.bench.tracebench``: per-call medians of the sparse reducers on loopback.

For each P of ``--nodes``, gradient size of ``--m`` and reducer of ``--reducers``, P worker
processes (gloo on loopback, ``gtopk.run.spawn``) make ``--calls`` timed calls (after
``--warmup``), twice:

* ``call``: ``reduce`` as training makes it (no alignment): each rank times its call from
  a common barrier; the call's time is the slowest rank's (selection, communication,
  put-back and the update);
* ``commu``: with ``align_timing`` (a barrier before and after the communication, as
  ``gtopk.perf.netbench``): from the last rank's start to the last rank's end, on the
  host's one clock: the collective alone.

``--realtime`` (root or CAP_SYS_NICE): every thread of every worker runs the timed calls
under ``SCHED_FIFO`` (back to ``SCHED_OTHER`` after them), so that on a machine shared with
other jobs the figures are what the code costs when it gets the cores, as on an idle one;
the kernel's real-time throttling still leaves the other jobs 5 % of the CPU.

Prints one line per case with the medians (and the quartiles) in ms, and writes them as
CSV with ``--csv``. It uses only the reducers' public interface, so the same file measures
another checkout of this package (``PYTHONPATH=<checkout> python <this file>``): the
before/after numbers of docs/performance.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time

import torch
import torch.distributed as dist

from gtopk.host import scheduling

REDUCERS = ("gtopk_tree", "gtopk_rd", "topk")


def build(name: str, density: float, align: bool):
    from gtopk.reducers import GTopKReducer, TopKReducer

    if name == "topk":
        return TopKReducer(density, align_timing=align)
    algorithm = {"gtopk_tree": "tree", "gtopk_rd": "recursive_doubling"}[name]
    return GTopKReducer(density, algorithm=algorithm, align_timing=align)


def worker(
    rank: int, P: int, m: int, names: list[str], density: float, warmup: int, calls: int, realtime: bool = False
) -> dict | None:
    """Collective. On rank 0: {(reducer, "call"|"commu"): [seconds per call]}."""
    grad = torch.randn(m, generator=torch.Generator().manual_seed(rank))
    out = {}
    for name in names:
        for mode in ("call", "commu"):
            reducer = build(name, density, align=mode == "commu")
            times = []
            for i in range(warmup + calls):
                if realtime and i == warmup:
                    scheduling(True)
                dist.barrier()
                t0 = time.perf_counter()
                reducer.reduce(grad)
                t1 = time.perf_counter()
                mine = torch.tensor([t1 - t0, *reducer.commu_span], dtype=torch.float64)
                every = [torch.empty_like(mine) for _ in range(P)]
                dist.all_gather(every, mine)
                e = torch.stack(every)
                if i >= warmup:
                    times.append(e[:, 0].max().item() if mode == "call" else (e[:, 2].max() - e[:, 1].max()).item())
            if realtime:
                scheduling(False)
            out[(name, mode)] = times
    return out if rank == 0 else None


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def main(argv: list[str] | None = None) -> None:
    from gtopk.run.spawn import spawn

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--m", type=int, nargs="+", default=[269722, 14728266], help="gradient entries")
    ap.add_argument("--reducers", nargs="+", default=list(REDUCERS), choices=REDUCERS)
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--realtime", action="store_true", help="timed calls under SCHED_FIFO (root)")
    ap.add_argument("--label", default="", help="a name for this checkout in the output (e.g. before, after)")
    ap.add_argument("--csv", help="append the rows to this CSV file")
    a = ap.parse_args(argv)
    if any(P < 2 for P in a.nodes) or a.calls < 1 or a.warmup < 0 or not 0 < a.density <= 1:
        ap.error("--nodes must be >= 2, --calls >= 1, --warmup >= 0 and --density in (0, 1]")
    if a.realtime:
        try:
            scheduling(True)
            scheduling(False)
        except PermissionError:
            ap.error("--realtime needs root or CAP_SYS_NICE (SCHED_FIFO); leave it out")
    rows = []
    for P in a.nodes:
        for m in a.m:
            load = os.getloadavg()[0]
            args = (m, a.reducers, a.density, a.warmup, a.calls, a.realtime)
            got = spawn(worker, P, args, timeout=1800)[0]
            for (name, mode), times in got.items():
                q1, med, q3 = quartiles(times)
                row = {"label": a.label, "reducer": name, "mode": mode, "nodes": P, "m": m, "calls": len(times)}
                row |= {"median_ms": 1e3 * med, "q1_ms": 1e3 * q1, "q3_ms": 1e3 * q3, "load1": load}
                rows.append(row)
                print(
                    f"{a.label:8} P={P:<2} m={m:<9} {name:<10} {mode:<5} median {row['median_ms']:8.3f} ms "
                    f"(quartiles {row['q1_ms']:.3f}-{row['q3_ms']:.3f}) load {load:.1f}",
                    flush=True,
                )
    if a.csv:
        new = not os.path.exists(a.csv)
        with open(a.csv, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
