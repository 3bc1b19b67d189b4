"""The calibrated alpha-beta model: network profiles, and t_commu / t_iter predictions.

A *network profile* (``NetworkProfile``, JSON) holds alpha (s per message) and beta (s per
byte) fitted by ``gtopk.perf.netbench`` on some cluster, and the software cost per message of
the sparse reducers' own rounds it measured there (``software``; 0 in a profile from before:
``Network.sparse``). From it, a reducer's config (its
``_target_`` class provides ``predict_commu``) and the measured or replayed per-iteration
times of one job (t_data, t_compute, t_compr, t_update), ``predict_iter`` predicts t_commu
and t_iter at any P (1 .. 1024 and beyond): only t_commu and the loop's non-finite check
(``check_time``) depend on P in the model; the local
times are taken as measured. Reducers that overlap communication with backward (DDP and
its hooks) hide what the replayed backward hides: each bucket's communication starts when
its last gradient is ready and the bucket before it is done (``predict_body`` of the class).

``python -m gtopk.perf.model --network PROFILE RUN_DIR...`` prints prediction against
measurement for every finished job under the given directories.

Names and classes read from records (a run folder's summary.json and config.yaml, or wandb)
are data, never code: a model name must be one of ``conf/model/*.yaml`` (``known_models``)
and a reducer's ``_target_`` one of those in ``conf/reducer/*.yaml`` (``known_reducers``)
before a config is loaded, a module imported or anything instantiated; others raise
``UnknownConfig`` (one line), and the folder analyses skip that job with a warning.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from hydra.utils import get_class

from gtopk.records.rundir import finished, write_json_atomic
from gtopk.reducers.costmodel import Network, ring_time

LOCAL_TIMES = ("t_data", "t_compute", "t_compr", "t_update")
NO_SOFTWARE = "no per-message software cost measured (made before netbench measured it): taken as 0"
CONF = Path(__file__).resolve().parents[2] / "conf"


class UnknownConfig(ValueError):
    """A model name or reducer class read from records that the configs in ``conf/`` do not
    name; nothing of it was loaded, imported or instantiated. The message is one line."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.cache
def known_models() -> tuple[str, ...]:
    """The model names there are configs for: the stems of ``conf/model/*.yaml``."""
    return tuple(sorted(p.stem for p in (CONF / "model").glob("*.yaml")))


@functools.cache
def known_reducers() -> frozenset[str]:
    """The reducer classes the configs name: every ``_target_`` of ``conf/reducer/*.yaml``
    (read as YAML; nothing imported)."""
    from omegaconf import OmegaConf

    return frozenset(str(OmegaConf.load(p).get("_target_")) for p in (CONF / "reducer").glob("*.yaml"))


def check_model(name: object) -> str:
    """``name`` when it is a model of ``known_models`` (a bare stem: no path separator, no
    ``..``); UnknownConfig otherwise."""
    if not isinstance(name, str) or "/" in name or "\\" in name or ".." in name or name not in known_models():
        raise UnknownConfig(
            f"model={_shown(name)} is not one of conf/model/*.yaml ({', '.join(known_models())}); only those are loaded"
        )
    return name


def check_reducer(reducer_cfg: Mapping) -> str:
    """The ``_target_`` of ``reducer_cfg`` when ``known_reducers`` has it; UnknownConfig
    (before anything is imported) otherwise."""
    target = reducer_cfg.get("_target_") if isinstance(reducer_cfg, Mapping) else None
    if not isinstance(target, str) or target not in known_reducers():
        raise UnknownConfig(
            f"reducer._target_={_shown(target)} is not a reducer of conf/reducer/*.yaml "
            f"({', '.join(sorted(known_reducers()))}); only those are imported"
        )
    return target


@dataclass
class NetworkProfile:
    """alpha (s), beta (s/byte), software (s per message of the sparse reducers' own rounds
    beyond alpha: ``gtopk.perf.software``) and where they came from."""

    alpha: float
    beta: float
    name: str = "custom"
    cluster: dict = field(default_factory=dict)
    backend: str = ""  # the torch.distributed backend measured (gloo, nccl); "" when not measured
    samples: list = field(default_factory=list)  # [(bytes, one-way seconds)] behind the fit
    notes: str = ""
    software: float = 0.0
    software_samples: list = field(default_factory=list)  # seconds per message, one per timed reduce
    software_notes: str = ""  # how it was measured
    ring_alpha: float | None = None  # s per step of the backend's own ring collectives (None: alpha)
    ring_alpha_at: dict = field(default_factory=dict)  # {P: s per ring step measured with P ranks up}

    @property
    def network(self) -> Network:
        """The network at the ping-pong's P (``ring_alpha``); ``network_at`` for a given P."""
        return Network(alpha=self.alpha, beta=self.beta, software=self.software, ring_alpha=self.ring_alpha)

    def ring_step(self, P: int) -> float | None:
        """The ring step's latency the model uses at P: the one measured with P ranks up
        (``ring_alpha_at``), else the one measured at the nearest P on a log2 scale (ties: the
        larger P; beyond the largest measured P, the largest's), else ``ring_alpha``."""
        if not self.ring_alpha_at:
            return self.ring_alpha
        at = {int(p): float(v) for p, v in self.ring_alpha_at.items()}
        nearest = min(at, key=lambda q: (abs(math.log2(q) - math.log2(max(P, 1))), -q))
        return at[nearest]

    def network_at(self, P: int) -> Network:
        """The network the model uses for a job of P ranks (its ring step: ``ring_step``)."""
        return dataclasses.replace(self.network, ring_alpha=self.ring_step(P))

    @property
    def bits_per_s(self) -> float:
        return 8.0 / self.beta if self.beta > 0 else math.inf

    @classmethod
    def paper(cls) -> NetworkProfile:
        n = Network.paper()
        return cls(
            alpha=n.alpha,
            beta=n.beta,
            name="paper",
            notes="the authors' fit on their 32-node 1 Gbit/s Ethernet cluster",
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> NetworkProfile:
        """A profile file, or ``paper`` for the authors' published fit."""
        if str(path) == "paper":
            return cls.paper()
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(
                f"network profile {p} does not exist; make one with "
                "`python -m gtopk.perf.netbench cluster=...` or pass `paper`"
            )
        d = json.loads(p.read_text())
        if "software" not in d:  # a profile from before netbench measured it
            d["software_notes"] = NO_SOFTWARE
            print(f"note: {p}: {NO_SOFTWARE}", file=sys.stderr)
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def fit_alpha_beta(
    sizes: Sequence[float], times: Sequence[float], small: float = 8192, large: float = 1 << 20
) -> tuple[float, float]:
    """Fit ``t = alpha + beta * n`` to one-way times of messages of ``sizes`` bytes.

    beta is the least-squares slope over the messages of at least ``large`` bytes (where
    bandwidth dominates); alpha is ``t - beta * n`` of the smallest message, where it has
    at most ``small`` bytes (what a tiny message costs). Mid-sized messages are left out of
    both: a token-bucket shaper lets them run ahead of the rate for ``burst`` bytes, which
    would bend a single line, and would take beta x n off a small one that never paid it
    (an emulated 100 Mbit/s link's 8 KiB message: 0.69 ms; alpha came out at 0.02 ms as the
    median of t - beta x n over 8 B, 1 KiB and 8 KiB). With fewer than two large sizes or no
    small one, a plain least-squares line over all points is returned."""
    if len(sizes) != len(times) or len(set(sizes)) < 2:
        raise ValueError("fit_alpha_beta needs at least two distinct message sizes")
    big = [(n, t) for n, t in zip(sizes, times) if n >= large]
    tiny = [(n, t) for n, t in zip(sizes, times) if n <= small]
    if len({n for n, _ in big}) < 2 or not tiny:
        big, tiny = list(zip(sizes, times)), []
    xs, ys = [n for n, _ in big], [t for _, t in big]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if not tiny:
        return my - beta * mx, beta
    n, t = min(tiny)
    return t - beta * n, beta


def reducer_class(reducer_cfg: Mapping) -> type:
    """The reducer class of a config, imported only when ``conf/reducer`` names it."""
    return get_class(check_reducer(reducer_cfg))


def predict_commu(reducer_cfg: Mapping, P: int, m: int, net: Network, shapes: list | None = None) -> float:
    """t_commu of one reduce of an m-entry gradient on P ranks (the config's class decides;
    PowerSGD also needs the parameters' ``shapes``, see ``param_shapes``)."""
    settings = {k: v for k, v in reducer_cfg.items() if k != "_target_"}
    return reducer_class(reducer_cfg).predict_commu(P, m, net, shapes=shapes, **settings)


def param_shapes(model_cfg: Mapping) -> list[tuple[int, ...]]:
    """Shapes of the parameters of a model config's ``net``, built on the meta device."""
    import torch
    from hydra.utils import instantiate

    with torch.device("meta"):
        net = instantiate(model_cfg["net"])
    return [tuple(p.shape) for p in net.parameters()]


def model_shapes(name: object) -> list[tuple[int, ...]]:
    """``param_shapes`` of ``conf/model/<name>.yaml``, for the reducers whose model needs the
    layers (PowerSGD). ``name`` comes from records: UnknownConfig, with nothing loaded,
    unless ``check_model`` accepts it."""
    return _model_shapes(check_model(name))


@functools.cache
def _model_shapes(name: str) -> list[tuple[int, ...]]:
    from omegaconf import OmegaConf

    return param_shapes(OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml")))


def check_time(P: int, net: Network) -> float:
    """The training loop's non-finite check at P (``gtopk.train.faults.NonFiniteGuard``): one
    all-reduce of P float32 flags every step, gloo's or NCCL's own ring (bare alpha), none at
    P = 1. A P = 1 job's local times do not hold it, so the model adds it at P."""
    return ring_time(P, P, net)


def predict_iter(
    reducer_cfg: Mapping,
    P: int,
    m: int,
    net: Network,
    local: Mapping[str, float],
    images_per_iter: int,
    shapes: list | None = None,
) -> dict:
    """Predicted t_commu (all of the reducer's communication), t_exposed (what of it the step
    waits for: all, except for a reducer that overlaps it with backward), t_check (the
    training loop's non-finite check: ``check_time``), t_iter and images/s per worker at P,
    from local times ``local`` (t_data, t_compute, t_compr, t_update of a job; missing ones
    count as 0)."""
    t = {k: float(local.get(k, 0.0)) for k in LOCAL_TIMES}
    settings = {k: v for k, v in reducer_cfg.items() if k != "_target_"}
    cls = reducer_class(reducer_cfg)
    t_commu = cls.predict_commu(P, m, net, shapes=shapes, **settings)
    body = cls.predict_body(P, m, net, t["t_compute"], shapes=shapes, **settings)  # DDP: hides some
    t_check = check_time(P, net)
    t_iter = t["t_data"] + body + t_check + t["t_compr"] + t["t_update"]
    return {
        "nodes": P,
        "t_commu": t_commu,
        "t_exposed": body - t["t_compute"],
        "t_check": t_check,
        "t_iter": t_iter,
        "images_per_s_per_worker": images_per_iter / t_iter,
    }


def finished_jobs(roots: Iterable[str | Path]) -> list[tuple[dict, dict]]:
    """(summary, resolved config) of every finished job under ``roots``."""
    return [(d.read_summary(), d.read_config()) for d in finished(roots)]


def compare(summary: Mapping, cfg: Mapping, net: Network | NetworkProfile) -> dict:
    """Measured against predicted t_commu and t_iter for one finished job (on a profile: its
    ``network_at`` the job's P); UnknownConfig when its model or reducer is not one of
    ``conf/`` (see ``check_model``)."""
    P, m = int(summary["nodes"]), int(summary["params"])
    net = net.network_at(P) if isinstance(net, NetworkProfile) else net
    images = int(summary["batch_per_worker"]) * int(summary["grad_accum_steps"])
    pred = predict_iter(cfg["reducer"], P, m, net, summary, images, model_shapes(summary["model"]))
    out = {k: summary.get(k) for k in ("reducer", "model", "nodes", "density", "compute", "cluster")}
    out.update(
        t_commu_measured=summary["t_commu"],
        t_commu_predicted=pred["t_commu"],
        t_iter_measured=summary["t_iter"],
        t_iter_predicted=pred["t_iter"],
    )
    out["commu_ratio"] = (summary["t_commu"] / pred["t_commu"]) if pred["t_commu"] > 0 else None
    out["iter_ratio"] = summary["t_iter"] / pred["t_iter"]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", required=True, help="network profile JSON (from gtopk.perf.netbench) or `paper`")
    ap.add_argument("runs", nargs="+", help="directories holding finished jobs")
    args = ap.parse_args(argv)
    prof = NetworkProfile.load(args.network)
    net = prof.network
    print(
        f"network {prof.name}: alpha {net.alpha * 1e3:.4f} ms, software {net.software * 1e3:.4f} ms per sparse message"
    )
    rows = []
    for d in finished(args.runs):
        try:
            rows.append(compare(d.read_summary(), d.read_config(), prof))
        except UnknownConfig as e:  # a record's name that conf/ does not have: that job only
            print(f"warning: skipping {d.path}: {e}", file=sys.stderr)
    if not rows:
        raise SystemExit(f"no finished jobs (summary.json + config.yaml) under {' '.join(args.runs)}")
    print(
        f"{'reducer':8} {'model':9} {'P':>3} {'t_commu meas':>13} {'pred':>9} {'ratio':>6} {'t_iter meas':>12} {'pred':>9}"
    )
    for r in sorted(rows, key=lambda r: (r["model"], r["reducer"], r["nodes"])):
        ratio = f"{r['commu_ratio']:.2f}" if r["commu_ratio"] is not None else "-"
        print(
            f"{r['reducer']:8} {r['model']:9} {r['nodes']:>3} {r['t_commu_measured']:>13.4f} "
            f"{r['t_commu_predicted']:>9.4f} {ratio:>6} {r['t_iter_measured']:>12.4f} {r['t_iter_predicted']:>9.4f}"
        )


if __name__ == "__main__":
    main()
