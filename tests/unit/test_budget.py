"""Timed steps from a time budget (gtopk.train.budget), its settings' checks, and the
Fig. 6 experiment that uses it: the paper's four models in its sweep, each of which
passes the checks a job runs before any worker starts."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from gtopk.run.checks import ConfigError, machine_fits, reducer_settings, validate
from gtopk.train.budget import steps_in_budget, timed_steps


@pytest.mark.parametrize(
    "t_first, want",
    [
        (0.1, 6),  # 30 would fit: capped at iters
        (0.7, 4),  # 3 / 0.7 = 4.3
        (1.5, 2),
        (2.9, 1),
        (6.5, 1),  # longer than the budget: still min_iters
    ],
)
def test_as_many_steps_as_fit_in_the_budget_within_the_bounds(t_first, want):
    assert steps_in_budget(t_first, iters=6, budget_s=3.0, min_iters=1) == want


def test_no_budget_times_iters_and_min_iters_never_exceeds_iters():
    assert steps_in_budget(50.0, iters=3, budget_s=None) == 3
    assert steps_in_budget(50.0, iters=2, budget_s=1.0, min_iters=5) == 2
    assert steps_in_budget(50.0, iters=6, budget_s=1.0, min_iters=3) == 3


def test_without_a_budget_no_collective_is_needed():
    """No process group in this test process: without budget_s nothing is communicated."""
    bench = OmegaConf.create({"warmup": 1, "iters": 4, "budget_s": None, "min_iters": 1})
    assert timed_steps(9.0, bench, device="cpu") == 4


@pytest.mark.parametrize(
    "override, setting",
    [("benchmark.budget_s=0", "benchmark.budget_s"), ("benchmark.min_iters=0", "benchmark.min_iters")],
)
def test_a_bad_budget_setting_is_named(compose, override, setting):
    cfg = compose(["experiment=fig6_reproduce", override])
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        validate(cfg)


@pytest.mark.parametrize("experiment", ["fig6_reproduce", "fig6_baselines"])
def test_fig6_sweeps_the_papers_four_models_and_each_job_passes_the_checks(compose, experiment):
    sweep = compose([f"experiment={experiment}"], hydra=True).hydra.sweeper.params
    models = str(sweep.model).split(",")
    assert sorted(models) == ["alexnet", "resnet20", "resnet50", "vgg16"]
    for model in models:
        for reducer in str(sweep.reducer).split(","):  # PowerSGD: compressing after the warm-up
            cfg = compose([f"experiment={experiment}", f"model={model}", f"reducer={reducer}", "nodes=8"])
            validate(cfg)
            reducer_settings(cfg)
            machine_fits(cfg, "cpu")
            assert cfg.compute.warmup_sleep is False and cfg.benchmark.budget_s > 0
