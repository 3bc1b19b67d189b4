"""Scaling efficiency e(P) = v_P / v_1 (v: images/s per worker): measured, modelled, paper.

Which v_1: one per model and setup, as in the paper (which used one single-node
throughput per model for all methods): the P = 1 job of the *baseline* reducer, by default
(``v1_order``) the first reducer whose update is the exact average, payoff baselines first:
``ddp`` (at P = 1 that is plain single-worker SGD: DDP wraps the model only for P > 1,
and its reduce returns the gradient as it is, without the copy the dense reducer makes),
else ``dense`` (what their classes declare, ``analysis.reducers``). The sparse lines therefore start below 1 at P = 1 when their top-k
selection costs time, as it would on a single machine. A setup is one experiment on one cluster with one compute source, model,
batch and density (``SETUP``); runs of different setups are never mixed.

Modelled points (``modelled``): t_commu from the reducer class's alpha-beta formula with a
calibrated network profile (``gtopk.perf.netbench``), plus that reducer's measured local times
(t_data, t_compute, t_compr, and as t_update the rest of the iteration: the update,
flattening, the non-finite check; see ``rest_of_iteration``) taken from its job at
``local_from`` workers
(default P = 1: the worker alone on the machine, the nearest this box gets to one worker
per machine; at larger P on a small machine the workers' CPU-side work shares the cores
and is inflated). Overlapping reducers (DDP) hide what their ``predict_body`` says
backward hides (``gtopk.perf.model.predict_iter``). A line whose model or reducer class read from the
records is not one of ``conf/`` is left out with a one-line warning: nothing named by
records is loaded or imported unless ``conf/`` has it (``gtopk.perf.model.check_model``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

import pandas as pd

from analysis.reducers import declared, exact_rows, names, ordered
from gtopk import paper
from gtopk.perf.model import LOCAL_TIMES, UnknownConfig, check_reducer, model_shapes, predict_iter
from gtopk.perf.netprofile import NetworkProfile

SETUP = ["name", "cluster", "compute", "model", "batch_per_worker", "grad_accum_steps", "density"]
V = "images_per_s_per_worker"


def _setups(jobs: pd.DataFrame):
    return jobs.groupby(SETUP, dropna=False, sort=True)


def v1_order(jobs: pd.DataFrame) -> list[str]:
    """The reducers of ``jobs`` whose P = 1 job may give v_1: those whose update is the exact
    average, payoff baselines first (DDP, then dense), each group in plot order."""
    exact = jobs[exact_rows(jobs)]
    names = ordered(exact["reducer"])
    return [n for n in names if declared(n).payoff_baseline] + [n for n in names if not declared(n).payoff_baseline]


def baseline_v1(jobs: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """v_1 per setup: the median throughput of the P = 1 jobs of the first reducer in
    ``baseline`` (comma-separated config names; default ``v1_order``) that has one in that
    setup; ``v1_from`` names it."""
    order = [b.strip() for b in baseline.split(",") if b.strip()] if baseline else v1_order(jobs)
    rows = []
    for key, g in _setups(jobs):
        for red in order:
            one = g[(g["nodes"] == 1) & (g["reducer"] == red)]
            if not one.empty:
                rows.append({**dict(zip(SETUP, key)), "v1": float(one[V].median()), "v1_from": red})
                break
    if not rows:
        which = baseline or "a reducer whose update is the exact average"
        example = order[0] if order else next(iter(names(lambda d: d.exact_average)), "...")
        raise ValueError(
            f"no P = 1 job of {which} found: it gives v_1; run one (nodes=1 reducer={example}) or pick another --baseline"
        )
    return pd.DataFrame(rows)


def measured(jobs: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """e(P) of every (setup, reducer, P) measured; duplicates (same setup, reducer and P)
    give their median throughput (``n_jobs`` says how many)."""
    v = (
        jobs.groupby(SETUP + ["reducer", "nodes"], dropna=False)[V]
        .agg(["median", "size"])
        .rename(columns={"median": "v", "size": "n_jobs"})
        .reset_index()
    )
    v = v.merge(baseline_v1(jobs, baseline), on=SETUP, how="inner")
    v["efficiency"] = v["v"] / v["v1"]
    v["kind"] = "measured"
    return v


def rest_of_iteration(jobs: pd.DataFrame, commu_is_local: bool = False) -> float:
    """Median t_iter less the named parts (t_data, t_compute, t_compr, t_commu): the update
    and everything else a step does (flattening the gradient, the non-finite check).
    ``commu_is_local``: t_commu stays in the rest (at P = 1 nothing is communicated, and
    what a reducer times as t_commu there, e.g. dense's copy, is local work)."""
    parts = ["t_data", "t_compute", "t_compr"] + ([] if commu_is_local else ["t_commu"])
    named = jobs[parts].median().sum()
    return max(0.0, float(jobs["t_iter"].median() - named))


def local_times(jobs: pd.DataFrame, local_from: int = 1) -> pd.DataFrame:
    """Per (setup, reducer): the local times of its job at ``local_from`` workers, or of
    its job with the fewest workers when there is none at ``local_from``."""
    rows = []
    for key, g in jobs.groupby(SETUP + ["reducer"], dropna=False, sort=True):
        at = g[g["nodes"] == local_from]
        if at.empty:
            at = g[g["nodes"] == g["nodes"].min()]
        src = at.iloc[-1]
        row = dict(zip(SETUP + ["reducer"], key))
        row.update({k: float(at[k].median()) for k in LOCAL_TIMES})
        row["t_update"] = rest_of_iteration(at, commu_is_local=int(src["nodes"]) == 1)
        row.update(
            local_from_nodes=int(src["nodes"]),
            reducer_cfg=src["reducer_cfg"],
            params=int(src["params"]),
            images_per_iter=int(src["images_per_iter"]),
        )
        rows.append(row)
    return pd.DataFrame(rows)


def modelled(
    jobs: pd.DataFrame,
    net: NetworkProfile,
    nodes: Sequence[int] | None = None,
    baseline: str | None = None,
    local_from: int = 1,
    extend_to: Iterable[int] = (16, 32),
) -> pd.DataFrame:
    """e(P) predicted by the calibrated model at ``nodes`` (default: every measured P and
    ``extend_to``), one line per (setup, reducer); a line whose model or reducer ``conf/``
    does not have is left out, with a warning."""
    if nodes is None:
        nodes = sorted(set(int(p) for p in jobs["nodes"]) | set(extend_to))
    v1 = baseline_v1(jobs, baseline)
    rows = []
    for _, lt in local_times(jobs, local_from).iterrows():
        try:  # names from the records: only those conf/ has are loaded or imported
            check_reducer(lt["reducer_cfg"])
            shapes = model_shapes(lt["model"])  # PowerSGD's model needs the layers
        except UnknownConfig as e:
            print(f"warning: no modelled line of experiment {lt['name']!r}: {e}", file=sys.stderr)
            continue
        for P in nodes:
            pred = predict_iter(
                lt["reducer_cfg"], int(P), lt["params"], net.network_at(int(P)), lt, lt["images_per_iter"], shapes
            )
            rows.append(
                {
                    **{k: lt[k] for k in SETUP + ["reducer"]},
                    "nodes": int(P),
                    "v": pred[V],
                    "t_commu": pred["t_commu"],
                    "t_iter": pred["t_iter"],
                    "local_from_nodes": lt["local_from_nodes"],
                    **{k: lt[k] for k in LOCAL_TIMES},
                }
            )
    columns = SETUP + ["reducer", "nodes", "v", "t_commu", "t_iter", "local_from_nodes", *LOCAL_TIMES]
    out = pd.DataFrame(rows, columns=columns).merge(v1, on=SETUP, how="inner")
    out["efficiency"] = out["v"] / out["v1"]
    out["kind"] = "modelled"
    out["network"] = net.name
    return out


def paper_efficiency(models: Iterable[str] | None = None) -> pd.DataFrame:
    """The paper's e(P) (throughput.csv over its single-node value per model)."""
    df = pd.DataFrame(paper.rows(paper.THROUGHPUT)).rename(columns={V: "v"})
    v1 = df[df["nodes"] == 1].groupby("model")["v"].first().rename("v1")
    df = df.merge(v1, on="model")
    df["efficiency"] = df["v"] / df["v1"]
    df["kind"] = "paper"
    if models is not None:
        df = df[df["model"].isin(list(models))]
    return df.reset_index(drop=True)


def efficiencies(
    jobs: pd.DataFrame,
    net: NetworkProfile | None,
    baseline: str | None = None,
    local_from: int = 1,
    extend_to: Iterable[int] = (16, 32),
) -> pd.DataFrame:
    """Measured and (when ``net`` is given) modelled e(P), in one frame (``kind``)."""
    parts = [measured(jobs, baseline)]
    if net is not None:
        parts.append(modelled(jobs, net, baseline=baseline, local_from=local_from, extend_to=extend_to))
    return pd.concat(parts, ignore_index=True)
