"""The real Hydra configs compose (every experiment, every group option, the SLURM
launcher), every reducer config names a class that accepts it, so that
``hydra.utils.instantiate(cfg.reducer)`` builds the reducer, and the models have the
paper's sizes. One process, no worker."""

from __future__ import annotations

import inspect

import hydra
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.config import options

#: experiments whose runs join another experiment's folder (the hook baselines beside its reducers)
INTO = {
    "fig6_baselines": "fig6_reproduce",
    "fig5_baselines": "fig5_quick",
    "fig5_fashion_baselines": "fig5_fashion_quick",
}


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes(compose, experiment):
    cfg = compose([f"experiment={experiment}"])
    assert cfg.name == {"quick": "default", **INTO}.get(experiment, experiment)
    if experiment == "model_validation":  # the quick Fig. 5 runs' batch at P = 4: payoff's measured t_iter
        assert cfg.batch_size == compose(["experiment=fig5_quick", "nodes=4"]).batch_size
    elif experiment != "quick":  # the paper's per-worker batch, not the quick demo's
        assert cfg.batch_size == cfg.model.batch_size[cfg.mode]


@pytest.mark.parametrize("group", ["reducer", "model", "data"])
def test_every_group_option_composes(compose, group):
    for opt in options(group):
        cfg = compose([f"{group}={opt}", "mode=train"])
        assert cfg[f"{group}_name"] == opt
        assert "_target_" in cfg[group] or "_target_" in cfg[group].get("net", {})


def test_submitit_slurm_launcher_composes(compose):
    cfg = compose(["hydra/launcher=submitit_slurm"], hydra=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")


@pytest.mark.parametrize("reducer", options("reducer"))
def test_reducer_config_composes_and_matches_its_class(compose, reducer):
    node = OmegaConf.to_container(compose([f"reducer={reducer}", "density=0.01"]).reducer)
    cls = hydra.utils.get_class(node.pop("_target_"))
    params = inspect.signature(cls).parameters
    assert set(node) <= set(params), f"{reducer}: {set(node) - set(params)} not accepted by {cls}"
    if "density" in node:
        assert node["density"] == 0.01


@pytest.mark.parametrize(
    "model,count", [("vgg16", 14_728_266), ("resnet20", 269_722), ("alexnet", 61_100_840), ("resnet50", 25_557_032)]
)
def test_parameter_counts(compose, model, count):
    net = instantiate(compose([f"model={model}"]).model.net)
    assert sum(p.numel() for p in net.parameters()) == count
