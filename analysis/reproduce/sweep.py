"""What a ``run.py -m`` sweep is, read from its Hydra overrides and the composed config:
the keys overrides set, overrides merged over defaults, the values a key is swept over, and
the sweep directory and cluster of the sweep's first job. Local: nothing runs."""

from __future__ import annotations

from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser

ROOT = Path(__file__).resolve().parents[2]


def keys(overrides: list[str]) -> set[str]:
    """The config keys (or groups) that overrides set."""
    return {o.key_or_group for o in OverridesParser.create().parse_overrides(overrides)}


def merged(defaults: list[str], overrides: list[str]) -> list[str]:
    """``defaults`` whose key ``overrides`` does not set, then ``overrides``."""
    given = keys(overrides)
    return [d for d in defaults if d.split("=", 1)[0] not in given] + list(overrides)


def first_values(overrides: list[str]) -> list[str]:
    """``overrides`` with each sweep at its first value (what the sweep's first job gets)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [
        f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else text
        for text, o in zip(overrides, parsed)
    ]


def first_job(overrides: list[str]) -> tuple[Path, str, dict]:
    """The sweep directory, cluster name and cluster settings of the first job that
    ``run.py -m *overrides`` runs (each sweep override at its first value)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    first = first_values(overrides)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        full = compose("config", overrides=first, return_hydra_config=True)
        HydraConfig.instance().set_config(full)  # for ${hydra:runtime.choices.cluster}
        return Path(full.hydra.sweep.dir), full.cluster_name, OmegaConf.to_container(full.cluster, resolve=True)


def axis(overrides: list[str], key: str) -> list[str]:
    """The values ``run.py -m *overrides`` sweeps ``key`` over: the command line's, else the
    experiment's ``hydra.sweeper.params``, else the single composed value."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    parser = OverridesParser.create()
    given = [o for o in parser.parse_overrides(overrides) if o.key_or_group == key]
    if not given:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            full = compose("config", overrides=first_values(overrides), return_hydra_config=True)
        params = full.hydra.sweeper.params or {}
        if key not in params:
            return [str(OmegaConf.select(full, key))]
        given = parser.parse_overrides([f"{key}={params[key]}"])
    o = given[0]
    return list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
