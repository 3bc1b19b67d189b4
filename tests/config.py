"""Compose the project's real Hydra config, as ``run.py`` does (one place for every test)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def options(group: str) -> list[str]:
    """The choices of a config group (the files in ``conf/<group>/``)."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_config(overrides: list[str], hydra: bool = False) -> DictConfig:
    """The job config ``run.py`` would get for ``overrides``, resolved (``hydra=True``:
    with the ``hydra`` node, and registered as the current HydraConfig)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        full = compose("config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(full)
        job = OmegaConf.to_container(OmegaConf.create({k: v for k, v in full.items() if k != "hydra"}), resolve=True)
        cfg = OmegaConf.create(job)
        if hydra:
            with_hydra = OmegaConf.create({**job, "hydra": OmegaConf.to_container(full.hydra)})
            return with_hydra
        return cfg
