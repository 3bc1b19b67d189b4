"""Benchmarks (``make bench``): every test here is marked ``bench`` (not in ``make test``).

The tests record their medians in ``tests.bench.results``; at the end of the session this
prints the figures the README quotes, from this run: per size and thread count,
``topk_indices`` and ``torch.topk`` over ``x.abs().max()`` (ratio of medians), and the
harness overhead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.bench.results import HARNESS, STEPS
from tests.bench.results import SELECTION as RESULTS
from tests.bench.simulated_step import table

BENCH_DIR = Path(__file__).parent


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if BENCH_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.bench)


def ratio_lines() -> list[str]:
    """The ratio table from ``RESULTS`` (sizes whose three medians were all measured)."""
    lines = []
    for (kind, model, threads), t_max in sorted(RESULTS.items(), key=lambda kv: (kv[0][2], kv[0][1])):
        if kind != "abs_max":
            continue
        ours = RESULTS.get(("topk_indices", model, threads))
        ref = RESULTS.get(("torch_topk", model, threads))
        if ours is None or ref is None:
            continue
        merge = RESULTS.get(("merge", model, threads))
        sampled = RESULTS.get(("sampled", model, threads))
        lines.append(
            f"  {model:9s} threads={threads}  abs_max {t_max * 1e3:8.2f} ms   "
            f"topk_indices/abs_max {ours / t_max:5.2f}   torch.topk/abs_max {ref / t_max:5.2f}"
            + (f"   merge {merge * 1e3:7.2f} ms" if merge is not None else "")
            + (f"   sampled/topk_indices {sampled / ours:5.2f}" if sampled is not None else "")
        )
    return lines


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's tables
def pytest_terminal_summary(terminalreporter) -> None:
    lines = ratio_lines()
    if lines:
        terminalreporter.section("selection: ratios of medians to x.abs().max() (this run)")
        for line in lines:
            terminalreporter.write_line(line)
    if HARNESS:
        terminalreporter.section("harness overhead, ResNet-20, P = 1, batch 128 (this run)")
        terminalreporter.write_line(
            f"  median (t_iter - t_compute - t_compr - t_commu) / t_iter = {HARNESS['overhead_ratio'] * 100:.2f} % "
            f"over {HARNESS['iterations']:.0f} iterations; medians: t_iter {HARNESS['t_iter'] * 1e3:.1f} ms, "
            f"overhead {HARNESS['overhead'] * 1e3:.2f} ms (t_data {HARNESS['t_data'] * 1e3:.2f}, "
            f"t_update {HARNESS['t_update'] * 1e3:.2f}, t_check {HARNESS.get('t_check', float('nan')) * 1e3:.2f}); "
            f"1-min load average up to {HARNESS['loadavg']:.1f} on {os.cpu_count()} CPUs"
        )
    if STEPS:
        terminalreporter.section(
            f"simulated step at P = 32, fig5_paper_length, {STEPS['data']} 8 x 8, one thread (this run; medians)"
        )
        for line in table(STEPS["rows"]):
            terminalreporter.write_line("  " + line)
        terminalreporter.write_line(f"  1-min load average up to {STEPS['loadavg']:.1f} on {os.cpu_count()} CPUs")
