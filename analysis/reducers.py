"""What the analyses know about a reducer: what its class declares (``Reducer.declared``,
documented in ``gtopk/reducers/base.py``), for the settings of a record or of its
``conf/reducer/<name>.yaml``. The analyses keep no list of reducer names: display names,
plot order and colours, which reducers average exactly (dense S-SGD, DDP) and which are the
payoff baselines all come from here.

Where a record is at hand (a job's ``reducer`` node, e.g. ``reducer_cfg`` in
``analysis.load``), the class is the one its ``_target_`` names and the settings are its
own. Where only a name is (a figure's reducer column, a payoff label), the class and the
settings are those of ``conf/reducer/<name>.yaml``. Classes are imported only when a
``conf/reducer`` yaml names them (``gtopk.perf.model.check_reducer``: records are data,
never code); a record whose class no yaml names any more, or a name without a yaml (a
reducer deleted since), gets the base class's defaults (``Reducer.declared()``: plotted
last, not an exact average, not a baseline) with its own name for display.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pandas as pd

from gtopk.perf import model as perfmodel
from gtopk.reducers.base import Declared, Reducer


@functools.cache
def _conf(folder: str) -> dict[str, dict]:
    from omegaconf import OmegaConf

    found = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        found[path.stem] = node if isinstance(node, dict) else {}
    return found


def conf_reducers() -> dict[str, dict]:
    """Config name -> its ``conf/reducer/<name>.yaml`` (unresolved), every file there."""
    return _conf(str(perfmodel.CONF / "reducer"))


@functools.cache
def _declared(name: str, cfg_json: str, folder: str) -> Declared:
    cfg = json.loads(cfg_json)
    try:
        cls = perfmodel.reducer_class(cfg)
    except perfmodel.UnknownConfig:  # a name without a yaml, or a class no yaml names (any more)
        found = Reducer.declared()
    else:
        found = cls.declared({k: v for k, v in cfg.items() if k != "_target_"})
    return dataclasses.replace(found, display_name=found.display_name or name)


def declared(name: str, cfg: Mapping | None = None) -> Declared:
    """What reducer ``name`` declares: with a record's ``cfg`` (its ``reducer`` node), its
    class's for its settings; without one, or one with no ``_target_``, its yaml's.
    ``display_name`` is never None (``name`` where the class declares none)."""
    if not cfg or "_target_" not in cfg:
        cfg = conf_reducers().get(name, {})
    text = json.dumps(dict(cfg), sort_keys=True, default=str)
    return _declared(str(name), text, str(perfmodel.CONF / "reducer"))


def of_label(label: str) -> Declared:
    """``declared`` of a label's config name (``gtopk putback=exact``: ``gtopk``)."""
    return declared(str(label).split(" ")[0])


def display(label: str) -> str:
    """A reducer label for people: ``gtopk_exact`` -> ``gTop-k exact``, ``gtopk
    putback=exact`` -> ``gTop-k putback=exact`` (the settings that differ from the yaml's)."""
    _, *rest = str(label).split(" ")
    return " ".join([of_label(label).display_name, *rest])


def short(label: str) -> str:
    """For a map cell: the display name and the settings' values (``gTop-k exact``)."""
    _, *rest = str(label).split(" ")
    return " ".join([of_label(label).display_name, *(r.split("=", 1)[-1] for r in rest)])


def ordered(names: Iterable[str]) -> list[str]:
    """Names (or labels) in plot order: the declared ``plot_order``, then by name."""
    return sorted(set(names), key=lambda n: (of_label(n).plot_order, n))


def palette(names: Iterable[str]) -> dict[str, tuple | str]:
    """One colour per reducer: its declared ``color``, else the colour-blind palette's colour
    of its position in plot order among ``names``."""
    import seaborn as sns

    names = ordered(names)
    auto = sns.color_palette("colorblind", len(names))
    return {n: of_label(n).color or auto[i] for i, n in enumerate(names)}


def exact_rows(frame: pd.DataFrame) -> pd.Series:
    """Per row of a frame with a ``reducer`` column (and ``reducer_cfg`` where the records
    gave one): whether that reducer's update is the exact average of the gradients."""
    cfgs = frame["reducer_cfg"] if "reducer_cfg" in frame else [None] * len(frame)
    flags = [declared(n, c if isinstance(c, Mapping) else None).exact_average for n, c in zip(frame["reducer"], cfgs)]
    return pd.Series(flags, index=frame.index, dtype=bool)


def names(where: Callable[[Declared], bool] = lambda d: True) -> list[str]:
    """The config names of ``conf/reducer`` whose declarations satisfy ``where``, in plot order."""
    return ordered(n for n in conf_reducers() if where(declared(n)))


def payoff_baselines() -> list[str]:
    """The payoff baselines of ``conf/reducer`` (DDP, DDP-fp16, PowerSGD), in plot order."""
    return names(lambda d: d.payoff_baseline)


def reference_baseline() -> str | None:
    """The payoff baseline every verdict is against: the first whose update is the exact
    average (DDP); None when ``conf/reducer`` has none."""
    return next((n for n in payoff_baselines() if declared(n).exact_average), None)


def reference_display() -> str:
    """The display name of ``reference_baseline`` (DDP), for the speedups' wording."""
    ref = reference_baseline()
    return display(ref) if ref else "the reference baseline"
