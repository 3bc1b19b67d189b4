"""The config nodes a job builds objects from (``reducer``, ``cluster``, ``compute``,
``data``, ``model.net``: ``_target_`` and its arguments), built in the launching process
before any worker starts, so that a setting the class rejects (Hydra's
``InstantiationException``, whose cause sits on a line of its own) is one ``ConfigError``
line naming the node (``gtopk.run.checks.validate`` calls ``buildable``)."""

from __future__ import annotations

from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from gtopk.run.settings import ConfigError, one_line, shown


def build(cfg: Any, key: str, kind: type | None = None) -> Any:
    """``instantiate`` the config node at ``key`` (``reducer``, ``cluster``, ``compute``,
    ``data``, ``model.net``), any failure a ConfigError: the class's own message where it
    names ``key``'s settings, else one naming the node and the cause. ``kind``: the
    class the result must be (a ``_target_`` that builds something else is refused)."""
    from hydra.errors import InstantiationException

    node = OmegaConf.select(cfg, key)
    head = key.split(".")[0]
    choice = cfg.get(f"{head}_name")
    label = key if not choice else f"{key}={choice}" if head == key else f"{key} of {head}={choice}"
    try:
        built = instantiate(node)
    except Exception as e:  # noqa: BLE001 - whatever the class rejects is a bad setting
        cause = e.__cause__ if isinstance(e, InstantiationException) and e.__cause__ else e
        text = one_line(cause)
        if f"{key}." not in text and f"{key}=" not in text:
            text = (
                f"{label} cannot be built from its settings ({type(cause).__name__}: {text}); fix the {key}.* setting"
            )
        raise ConfigError(text) from None
    if kind is not None and not isinstance(built, kind):
        target = OmegaConf.select(cfg, f"{key}._target_", default=None)
        raise ConfigError(
            f"{key}._target_={shown(target)} does not build a {kind.__name__}; pick another {head}= or fix the class path"
        )
    return built


def buildable(cfg: Any) -> dict[str, Any]:
    """Every object the job builds from its config, built here once: ``compute``,
    ``cluster``, ``data`` (when the compute reads data; else None) and ``model.net`` (on the
    meta device: no memory); the reducer's class is imported (``reducer_settings`` builds
    it). Returns the built ``compute``, ``cluster`` and ``data`` by name."""
    from hydra.utils import get_class

    from gtopk.run.cluster.base import Cluster
    from gtopk.train.compute import Compute
    from gtopk.train.data.base import DataSource

    target = OmegaConf.select(cfg, "reducer._target_", default=None)
    try:
        get_class(target)
    except Exception as e:  # noqa: BLE001 - any import problem is a bad setting
        raise ConfigError(
            f"reducer._target_={shown(target)} cannot be imported ({one_line(e)}); "
            f"pick another reducer= (the files in conf/reducer/) or fix the class path"
        ) from None
    compute = build(cfg, "compute", Compute)
    data = build(cfg, "data", DataSource) if compute.needs_data else None
    built = {"compute": compute, "data": data, "cluster": build(cfg, "cluster", Cluster)}
    meta_net(cfg)
    return built


_NETS: dict[str, torch.nn.Module] = {}  # meta-device models by their resolved settings (a few)


def meta_net(cfg: Any) -> torch.nn.Module:
    """``model.net`` built on the meta device (no memory, no arithmetic), once per distinct
    setting; a setting its class rejects is a ConfigError (``build``)."""
    try:
        key = repr(OmegaConf.to_container(cfg.model.net, resolve=True))
    except Exception:  # noqa: BLE001 - not a node that resolves: build says what is wrong
        key = None
    if key not in _NETS:
        with torch.device("meta"):
            net = build(cfg, "model.net", torch.nn.Module)
        if key is None:
            return net
        if len(_NETS) >= 8:
            _NETS.clear()
        _NETS[key] = net
    return _NETS[key]
