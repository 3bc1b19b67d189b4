"""A seed counts once in the payoff (issue 46 point 4): runs of one seed from
``cluster=simulated`` and ``cluster=local`` are the same experiment, not two seeds."""

from __future__ import annotations

from pathlib import Path

from analysis.payoff.cells import one_per_seed, seeds_reach
from analysis.training import TrainRun
from gtopk.records.summary import SIMULATED_BACKEND


def run(seed, backend, top1, epochs=3, name=None) -> TrainRun:
    """A run reaching ``top1`` at every epoch of 10 iterations, from ``backend``."""
    curve = [(e, 10 * (e + 1), top1[e] if isinstance(top1, list) else top1) for e in range(epochs)]
    return TrainRun(
        run_dir=Path(name or f"runs/x/seed={seed},{backend}"),
        model="ResNet-20",
        data="fashion_mnist",
        nodes=4,
        reducer_name="gtopk",
        reducer_cfg={},
        label="gtopk",
        density=0.001,
        batch=32,
        accum=1,
        params=269722,
        curve=curve,
        seed=seed,
        backend=backend,
    )


def test_the_same_seed_simulated_and_real_counts_once():
    runs = [run(0, SIMULATED_BACKEND, 0.9), run(0, "gloo", 0.9), run(1, SIMULATED_BACKEND, 0.5)]
    kept = one_per_seed(runs)
    assert [(r.seed, r.backend) for r in kept] == [(0, "gloo"), (1, SIMULATED_BACKEND)]
    cell = seeds_reach(runs, 0.8)
    assert cell["seeds"] == 2
    assert cell["iterations_per_seed"] == "seed 0: 10; seed 1: -"
    # two seeds, one of which never reached it: the median is not reached (three would have said 10)
    assert cell["status"] != "reached"


def test_the_longer_run_of_a_seed_is_kept_and_unseeded_runs_stay():
    short, longer = run(2, "gloo", 0.5, epochs=2), run(2, SIMULATED_BACKEND, [0.5, 0.5, 0.5, 0.95], epochs=4)
    a, b = run(None, "gloo", 0.9, name="a"), run(None, "gloo", 0.9, name="b")
    kept = one_per_seed([short, a, longer, b])
    assert kept == [longer, a, b]
    assert seeds_reach([short, longer], 0.9)["iterations_to_target"] == 40
