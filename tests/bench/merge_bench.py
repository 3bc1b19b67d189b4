"""Before/after timing of the CPU gTop-k merge: ``python -m tests.bench.merge_bench``.

Times ``gtopk.reducers.sparse.merge`` on NumPy arrays, as a gTop-k round calls it, against
``merge_before`` below: the merge it replaced (concatenate, stable argsort, compaction by
boolean masks, one ``np.partition`` of the whole union), kept here as the yardstick. Inputs:
two k-entry sparse vectors over [0, m) as a round carries them (a: this rank's, int64
indices; b: decoded from the wire, int32 indices; float32 normal values) sharing a given
fraction of their indices, at k = int(0.001 m) for ResNet-20 and VGG-16. The two are called
alternately (which one first alternates too), so that load from other processes hits both
alike. *hot*: call after call; *cold*: each call after a write to every cache line of a
32 MiB buffer (the caches as after a wake-up). Prints, per case, the medians in us and their
ratio, and the load average before and after; checks first that both merges give the same
result, bit for bit. Local, no processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from gtopk.reducers.sparse import merge
from tests.bench.selection_bench import DENSITY, SIZES

EVICT = np.zeros(32 << 20, dtype=np.uint8)


def merge_before(ia, va, ib, vb, k: int, dropped: list | None = None):
    """The merge as it was before the current one (same contract, same results)."""
    idx, val = np.concatenate([ia, ib]), np.concatenate([va, vb])
    order = np.argsort(idx, kind="stable")
    idx, val = idx[order], val[order]
    dup = np.flatnonzero(idx[1:] == idx[:-1])
    if dup.size:
        val[dup] += val[dup + 1]
        keep = np.ones(idx.size, dtype=bool)
        keep[dup + 1] = False
        idx, val = idx[keep], val[keep]
    if idx.size <= k:
        return idx, val
    mag = np.abs(val)
    thr = np.partition(mag, mag.size - k)[mag.size - k]
    mask = mag > thr
    need = k - int(np.count_nonzero(mask))
    if need > 0:
        mask[np.flatnonzero(mag == thr)[:need]] = True
    if dropped is not None:
        dropped.append((torch.from_numpy(idx[~mask]), torch.from_numpy(val[~mask])))
    sel = np.flatnonzero(mask)
    return idx[sel], val[sel]


def round_pair(m: int, k: int, overlap: float, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(ia, va, ib, vb) as a round merges them; b shares ``round(overlap k)`` of a's indices."""
    rng = np.random.default_rng(seed)
    ia = np.sort(rng.choice(m, k, replace=False))
    shared = rng.choice(ia, round(overlap * k), replace=False)
    free = np.ones(m, dtype=bool)
    free[ia] = False
    ib = np.sort(np.concatenate([shared, rng.choice(np.flatnonzero(free), k - shared.size, replace=False)]))
    return ia, rng.standard_normal(k, np.float32), ib.astype(np.int32), rng.standard_normal(k, np.float32)


def evict() -> None:
    EVICT[::64] += 1


def time_alternately(calls: dict, reps: int, cold: bool) -> dict[str, float]:
    """Median seconds of each call over ``reps`` alternations."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for rep in range(reps):
        for name in names if rep % 2 else names[::-1]:
            if cold:
                evict()
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bind(fn, pair: tuple, k: int, dropped: bool):
    """``fn`` on ``pair`` as a call of no arguments (a new ``dropped`` list each call)."""
    return lambda: fn(*pair, k, [] if dropped else None)


def same(x: tuple, y: tuple) -> bool:
    return all(np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b) for a, b in zip(x, y))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=300, help="calls of each merge per case (default 300)")
    ap.add_argument("--overlap", type=float, nargs="+", default=[0.0, 0.25, 0.5], help="shared fraction of indices")
    ap.add_argument("--models", nargs="+", default=["resnet20", "vgg16"], choices=list(SIZES))
    ap.add_argument("--dropped", action="store_true", help="collect what each merge drops (diagnostics on)")
    args = ap.parse_args()
    print(f"load average before: {open('/proc/loadavg').read().strip()}; {os.cpu_count()} CPUs")
    print("| model | k | overlap | caches | before us | now us | now / before |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        k = int(DENSITY * SIZES[model])
        for overlap in args.overlap:
            pair = round_pair(SIZES[model], k, overlap)
            want, got = [], []
            assert same(merge_before(*pair, k, want), merge(*pair, k, got)) and same(want[0], got[0])
            calls = {name: bind(fn, pair, k, args.dropped) for name, fn in (("before", merge_before), ("now", merge))}
            for cold in (False, True):
                med = time_alternately(calls, args.reps, cold)
                print(
                    f"| {model} | {k:,} | {overlap:.2f} | {'cold' if cold else 'hot'} | {med['before'] * 1e6:.1f} "
                    f"| {med['now'] * 1e6:.1f} | {med['now'] / med['before']:.2f} |",
                    flush=True,
                )
    print(f"load average after: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
