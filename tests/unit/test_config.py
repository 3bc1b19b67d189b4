"""The real Hydra configs compose, and every reducer config names a class that accepts
it, so that ``hydra.utils.instantiate(cfg.reducer)`` builds the reducer."""

from __future__ import annotations

import inspect
from pathlib import Path

import hydra
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"
REDUCERS = sorted(p.stem for p in (CONF / "reducer").glob("*.yaml"))


@pytest.mark.parametrize("reducer", REDUCERS)
def test_reducer_config_composes_and_matches_its_class(reducer):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"reducer={reducer}", "density=0.01"])
    node = OmegaConf.to_container(cfg.reducer, resolve=True)
    cls = hydra.utils.get_class(node.pop("_target_"))
    params = inspect.signature(cls).parameters
    assert set(node) <= set(params), f"{reducer}: {set(node) - set(params)} not accepted by {cls}"
    if "density" in node:
        assert node["density"] == 0.01
