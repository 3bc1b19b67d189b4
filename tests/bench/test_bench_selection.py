"""Selection and merge at the paper's model sizes, k = int(0.001 m), fp32 on CPU.

``topk_indices`` (``selection=exact``) and ``sampled_indices`` (``selection=sampled``)
against ``torch.topk(x.abs(), k)`` and the yardstick ``x.abs().max()`` (one pass over the
data), each with all cores and with one thread; ``merge`` of two k-entry sparse vectors. No timing is asserted: the figures are in the JSON and in the
session summary (ratios of medians, see conftest.py).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from gtopk.reducers.selection.exact import topk_indices, topk_rows
from gtopk.reducers.selection.sampled import sampled_indices
from gtopk.reducers.sparse import merge
from tests.bench.results import SELECTION, median_of
from tests.bench.selection_bench import DENSITY, SIZES, make_input, make_sparse_pair

CORES = len(os.sched_getaffinity(0))
THREADS = sorted({CORES, 1}, reverse=True)


@functools.lru_cache(maxsize=1)  # one large vector alive at a time (tests are grouped by size)
def vector(m: int) -> torch.Tensor:
    return make_input(m)


def rounds_for(m: int) -> int:
    """More rounds where one call is short, so every benchmark takes a few seconds at most."""
    return 101 if m < 1_000_000 else 9


@pytest.fixture
def threads(request):
    """Set torch's intra-op thread count for one benchmark, then restore it."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


CALLS = {
    "abs_max": lambda x, k: x.abs().max(),
    "topk_indices": lambda x, k: topk_indices(x, k),
    "torch_topk": lambda x, k: torch.topk(x.abs(), k, sorted=False),
    "sampled": lambda x, k: sampled_indices(x, k),
}


@pytest.mark.parametrize("kind", list(CALLS))  # innermost: the three run back to back per size
@pytest.mark.parametrize("threads", THREADS, indirect=True)
@pytest.mark.parametrize("model", list(SIZES))
def test_selection(benchmark, model, threads, kind):
    m = SIZES[model]
    x, k = vector(m), int(DENSITY * m)
    benchmark.group = f"selection {model} m={m:,} threads={threads}"
    benchmark.extra_info.update(m=m, k=k, threads=threads, kind=kind)
    benchmark.pedantic(CALLS[kind], args=(x, k), rounds=rounds_for(m), warmup_rounds=1)
    median = median_of(benchmark)
    if median is not None:
        SELECTION[(kind, model, threads)] = median
        t_max = SELECTION.get(("abs_max", model, threads))
        if t_max and kind != "abs_max":
            benchmark.extra_info["ratio_to_abs_max"] = median / t_max
        t_exact = SELECTION.get(("topk_indices", model, threads))
        if t_exact and kind == "sampled":
            benchmark.extra_info["sampled_over_exact"] = median / t_exact


@pytest.mark.parametrize("threads", THREADS, indirect=True)
@pytest.mark.parametrize("model", list(SIZES))
def test_merge(benchmark, model, threads):
    m = SIZES[model]
    k = int(DENSITY * m)
    pair = make_sparse_pair(m, k)
    benchmark.group = f"merge k={k:,}"
    benchmark.extra_info.update(m=m, k=k, threads=threads)
    idx, val = benchmark.pedantic(merge, args=(*pair, k), rounds=rounds_for(m) * 3, warmup_rounds=1)
    assert idx.numel() == k and val.numel() == k  # a merge that does its job, not a timing
    median = median_of(benchmark)
    if median is not None:
        SELECTION[("merge", model, threads)] = median


ROWS = {
    "topk_rows": lambda x, k: topk_rows(x, k),
    "row_by_row": lambda x, k: [topk_indices(row, k) for row in x],
}


@pytest.mark.parametrize("kind", list(ROWS))
@pytest.mark.parametrize("threads", THREADS, indirect=True)
def test_selection_of_p_rows(benchmark, threads, kind):
    """``cluster=simulated``'s selection: P = 32 ranks' accumulated vectors of ResNet-20's m
    as one matrix, all rows at once (``topk_rows``) against ``topk_indices`` row by row."""
    m, P = SIZES["resnet20"], 32
    x = torch.stack([make_input(m, seed=i) for i in range(P)])
    k = int(DENSITY * m)
    benchmark.group = f"selection of P = {P} rows, resnet20 m={m:,} threads={threads}"
    benchmark.extra_info.update(m=m, k=k, P=P, threads=threads, kind=kind)
    got = benchmark.pedantic(ROWS[kind], args=(x, k), rounds=21, warmup_rounds=1)
    assert len(got) == P and all(len(row) == k for row in got)  # a selection that does its job
    median = median_of(benchmark)
    if median is not None:
        SELECTION[(kind, "resnet20 x 32", threads)] = median
        together = SELECTION.get(("topk_rows", "resnet20 x 32", threads))
        if together and kind == "row_by_row":
            benchmark.extra_info["topk_rows_over_row_by_row"] = together / median
