"""Speed of top-k selection relative to one pass over the data, at the paper's model sizes.

``python -m tests.bench.selection_bench`` times, on one fp32 ``randn`` vector per size m and
k = int(0.001 m), ``topk_indices(x, k)`` (``selection=exact``), ``sampled_indices(x, k)``
(``selection=sampled``, DGC's sampled threshold), ``torch.topk(x.abs(), k)`` and the
yardstick ``x.abs().max()``. They are called round-robin (so that load from other processes
hits all of them alike), and the table shows the medians and the ratios of the medians
to ``x.abs().max()`` — with torch's default thread count and with one thread — the ratio
sampled / exact, and the median time of ``merge`` of two k-entry sparse vectors.

``python -m tests.bench.selection_bench --from-json runs/bench/bench-<time>.json`` prints the
same table from the medians of a ``make bench`` run, and its harness-overhead figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from gtopk.reducers.selection.exact import topk_indices
from gtopk.reducers.selection.sampled import sampled_indices
from gtopk.reducers.sparse import merge

# Parameter counts of the paper's models: ResNet-20, VGG-16 (CIFAR), ResNet-50, AlexNet.
SIZES = {"resnet20": 269_722, "vgg16": 14_728_266, "resnet50": 25_557_032, "alexnet": 61_100_840}
DENSITY = 0.001


def make_input(m: int, seed: int = 0) -> torch.Tensor:
    """The benchmark vector: m standard-normal fp32 values (fixed seed)."""
    return torch.randn(m, generator=torch.Generator().manual_seed(seed))


def make_sparse_pair(m: int, k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Two k-entry sparse vectors over [0, m) (ascending unique indices, normal values),
    as two workers' selections would be: ``(idx_a, val_a, idx_b, val_b)``."""
    g = torch.Generator().manual_seed(seed)
    out: list[torch.Tensor] = []
    for _ in range(2):
        out.append(torch.randperm(m, generator=g)[:k].sort().values)
        out.append(torch.randn(k, generator=g))
    return tuple(out)


def candidates(x: torch.Tensor, k: int) -> dict[str, Callable[[], object]]:
    """The timed calls on ``x``, by name (``abs_max`` is the yardstick)."""
    return {
        "abs_max": lambda: x.abs().max(),
        "topk_indices": lambda: topk_indices(x, k),
        "torch_topk": lambda: torch.topk(x.abs(), k, sorted=False),
        "sampled": lambda: sampled_indices(x, k),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def round_robin(
    calls: dict[str, Callable[[], object]], reps: int, device: torch.device = torch.device("cpu")
) -> dict[str, float]:
    """Median seconds of each call over ``reps`` rounds; each round calls every one once.
    On CUDA the clock is read only after the device has finished (synchronised before and
    after each call), so a time is the kernels' and the launches', not the launch alone."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():  # warm-up: first-touch allocations, lazy init
        fn()
    _sync(device)
    for _ in range(reps):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def measure(
    threads: int, reps: int, sizes: dict[str, int] = SIZES, device: torch.device = torch.device("cpu")
) -> list[dict]:
    """One row per size: medians (s) and the ratios to ``abs_max``, at ``threads`` threads,
    the tensors on ``device``."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows = []
    try:
        for model, m in sizes.items():
            x, k = make_input(m).to(device), int(DENSITY * m)
            med = round_robin(candidates(x, k), reps, device)
            pair = tuple(t.to(device) for t in make_sparse_pair(m, k))
            merged = {"merge": lambda pair=pair, k=k: merge(*pair, k)}
            med["merge"] = round_robin(merged, reps, device)["merge"]
            rows.append(
                {
                    "model": model,
                    "m": m,
                    "k": k,
                    "threads": threads,
                    "device": str(device),
                    **med,
                    "ratio_topk_indices": med["topk_indices"] / med["abs_max"],
                    "ratio_torch_topk": med["torch_topk"] / med["abs_max"],
                    "ratio_sampled_exact": med["sampled"] / med["topk_indices"],
                }
            )
    finally:
        torch.set_num_threads(before)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table of ``measure`` rows (milliseconds and ratios)."""
    lines = [
        "| model | m | k | threads | abs().max() ms | topk_indices ms | torch.topk ms "
        "| topk_indices / abs_max | torch.topk / abs_max | merge ms | sampled ms | sampled / topk_indices |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sampled = r.get("sampled")  # a JSON of a run from before the sampled selection has none
        lines.append(
            f"| {r['model']} | {r['m']:,} | {r['k']:,} | {r['threads']} | {r['abs_max'] * 1e3:.2f} "
            f"| {r['topk_indices'] * 1e3:.2f} | {r['torch_topk'] * 1e3:.2f} "
            f"| {r['ratio_topk_indices']:.2f} | {r['ratio_torch_topk']:.2f} | {r['merge'] * 1e3:.2f} "
            + (f"| {sampled * 1e3:.2f} | {r['ratio_sampled_exact']:.2f} |" if sampled is not None else "| - | - |")
        )
    return "\n".join(lines)


def from_bench_json(path: str) -> tuple[list[dict], dict | None]:
    """``measure``-style rows and the harness figures from a pytest-benchmark JSON file
    written by ``make bench`` (medians of that run)."""
    benches = json.loads(open(path).read())["benchmarks"]
    med: dict[tuple[str, int], dict] = {}
    harness = None
    for b in benches:
        info = b["extra_info"]
        if b["name"].startswith("test_harness_overhead"):
            harness = info
            continue
        kind = "merge" if b["name"].startswith("test_merge") else info["kind"]
        med.setdefault((info["m"], info["threads"]), {})[kind] = b["stats"]["median"]
    names = {m: model for model, m in SIZES.items()}
    rows = []
    for (m, threads), t in sorted(med.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        if {"abs_max", "topk_indices", "torch_topk", "merge"} <= set(t):
            rows.append(
                {
                    "model": names.get(m, "?"),
                    "m": m,
                    "k": int(DENSITY * m),
                    "threads": threads,
                    **t,
                    "ratio_topk_indices": t["topk_indices"] / t["abs_max"],
                    "ratio_torch_topk": t["torch_topk"] / t["abs_max"],
                    **({"ratio_sampled_exact": t["sampled"] / t["topk_indices"]} if "sampled" in t else {}),
                }
            )
    return rows, harness


def main(argv: list[str] | None = None) -> None:
    """Print the table for torch's default thread count and for one thread."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="timed rounds per size (default 15)")
    ap.add_argument(
        "--threads",
        type=int,
        nargs="*",
        default=None,
        help="thread counts to measure (default: torch's default, then 1)",
    )
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the vectors live")
    ap.add_argument("--json", metavar="PATH", help="also write the rows to PATH")
    ap.add_argument("--from-json", metavar="PATH", help="print the medians of a `make bench` JSON file instead")
    args = ap.parse_args(argv)
    if args.from_json:
        rows, harness = from_bench_json(args.from_json)
        print(f"medians from {args.from_json}")
        print(table(rows))
        if harness:
            print(
                f"harness overhead (ResNet-20, P = 1, batch 128, {harness['iterations']:.0f} iterations): "
                f"median {harness['overhead_ratio'] * 100:.2f} % of t_iter "
                f"({harness['overhead'] * 1e3:.2f} ms of {harness['t_iter'] * 1e3:.1f} ms; t_data "
                f"{harness['t_data'] * 1e3:.2f}, t_check {harness.get('t_check', float('nan')) * 1e3:.2f}, "
                f"t_update {harness['t_update'] * 1e3:.2f} ms; 1-min load average "
                f"{harness.get('loadavg_1min_before', float('nan')):.1f} before, "
                f"{harness.get('loadavg_1min_after', float('nan')):.1f} after)"
            )
        return
    device = torch.device(args.device)
    threads = args.threads or sorted({torch.get_num_threads(), 1}, reverse=True)
    rows = [row for t in threads for row in measure(t, args.reps, device=device)]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {where}, fp32, k = int({DENSITY} m), medians of {args.reps} round-robin rounds")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": where, "reps": args.reps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
