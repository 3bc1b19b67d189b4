"""Medians recorded by the benchmark tests of one session, for the summary that
``tests/bench/conftest.py`` prints at its end."""

from __future__ import annotations

# (kind, model, threads) -> median seconds; kind is abs_max, topk_indices, torch_topk or merge.
SELECTION: dict[tuple[str, str, int], float] = {}
# The harness-overhead job's medians (seconds) and ratio.
HARNESS: dict[str, float] = {}


def median_of(benchmark) -> float | None:
    """The median of a finished pytest-benchmark fixture (None when benchmarks are disabled)."""
    stats = getattr(benchmark, "stats", None)
    return stats.stats.median if stats else None


# The simulated step at P = 32 (tests/bench/test_bench_simulated_step.py): rows per reducer, data, load.
STEPS: dict = {}
