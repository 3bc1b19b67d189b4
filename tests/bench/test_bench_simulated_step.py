"""The simulated step at P = 32 per reducer (``tests.bench.simulated_step``): each sparse
reducer's median step against dense's, ``experiment=fig5_paper_length``'s settings, round-robin
in one process. The medians and ratios go to the benchmark's extra_info and to the session
summary; the benchmark's own time is the whole measurement."""

from __future__ import annotations

import os

from tests.bench.results import STEPS
from tests.bench.simulated_step import REDUCERS, default_data, measure


def test_simulated_step_at_p32(benchmark):
    data = default_data()
    got: list[dict] = []
    load_before = os.getloadavg()[0]
    benchmark.pedantic(
        lambda: got.extend(measure(list(REDUCERS), 32, rounds=4, steps=15, data=data, threads=1)),
        rounds=1,
        iterations=1,
    )
    assert [r["reducer"] for r in got] == list(REDUCERS) and all(r["steps"] == 45 for r in got)
    dense = got[0]["step_s"]
    ratios = {r["reducer"]: r["step_s"] / dense for r in got}
    benchmark.extra_info.update(
        data=data,
        nodes=32,
        medians_s={r["reducer"]: r["step_s"] for r in got},
        ratio_to_dense=ratios,
        loadavg_1min_before=load_before,
        loadavg_1min_after=os.getloadavg()[0],
    )
    STEPS.update(rows=got, data=data, loadavg=max(load_before, os.getloadavg()[0]))
