"""The calibrated alpha-beta model: t_commu / t_iter predictions.

A *network profile* (``gtopk.perf.netprofile.NetworkProfile``, JSON) holds alpha (s per message)
and beta (s per byte) fitted by ``gtopk.perf.netbench`` on some cluster, the software cost
per message of the sparse reducers' own rounds it measured there (``software``; 0 in a
profile from before: ``Network.sparse``) and the ring step at each P it measured
(``network_at``). From it, a reducer's config (its
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
import functools
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from hydra.utils import get_class

from gtopk.perf.netprofile import NetworkProfile
from gtopk.records.rundir import finished
from gtopk.reducers.costmodel import Network, ring_time

LOCAL_TIMES = ("t_data", "t_compute", "t_compr", "t_update")
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
