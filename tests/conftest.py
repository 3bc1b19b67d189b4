"""Test tiers and the one config-composing fixture.

Tiers, by folder (a marker each, applied here): ``unit`` (one process, no spawn),
``distributed`` (worker groups on loopback), ``e2e`` (``run.py`` and the make targets as
a user runs them), ``netns`` (the emulated cluster: network namespaces). ``make test``
runs every tier except tests marked ``slow``; ``make test-all`` runs those too;
``bench`` (``tests/bench/``) runs only under ``make bench``, ``gpu`` (``tests/gpu/``: NCCL on
real GPUs) only under ``make test-gpu``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from tests.config import compose_config

torch.set_num_threads(1)
TIERS = ("unit", "distributed", "e2e", "netns", "gpu")
HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """Every tier but ``gpu`` is the CPU one: on a GPU workstation its jobs, and the
    processes they start, see no GPU (``device=auto`` would put them on CUDA/NCCL)."""
    if "gpu" not in (config.option.markexpr or "").replace("not gpu", ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(HERE).parts
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture
def compose() -> Callable[..., DictConfig]:
    """``compose(overrides, hydra=False)``: the resolved job config of ``run.py``."""
    return compose_config
