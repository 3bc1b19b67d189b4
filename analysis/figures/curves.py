"""What Fig. 5 plots, from the records of training runs (``mode=train``): the curves per
epoch and per iteration, the table beside them, and the per-iteration gap diagnostics.

A curve is one run: its reducer (``gtopk_exact`` is gTop-k with the exact put-back), rho
where the reducer sparsifies, P, and its seed. The table has one row per curve label: runs
that differ only in their seed share a row, which gives the seeds, the mean and the min-max
of their final top-1, the iterations each seed needed to reach 99 % of the final top-1 of the
dense runs of the same model, data, image size, batch and P (epoch resolution, as
``analysis.training.iterations_to`` counts them; "not reached" where it did not), the final
coverage (``gtopk.records.regime``) and whether the top-1 was still rising at the end.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis.reducers import declared
from analysis.training import iterations_by_epoch, reducer_label, regime, trend_word
from gtopk.records.rundir import RunDir, read_jsonl, run_dirs

NOT_REACHED = "not reached"
#: per-iteration diagnostics of the reducers (gtopk.reducers.outcome.ReduceRecord)
GAP = ("update_nnz", "residual_norm", "lost_l1")


def curve_label(name: str, cfg: dict, nodes: int) -> str:
    """``gtopk rho=0.001 P=16``: the reducer with its non-default settings, rho where it
    sparsifies, and P."""
    text = reducer_label(name, cfg)
    if "density" in cfg:
        text += f" rho={float(cfg['density']):g}"
    return f"{text} P={nodes}"


def _run_meta(d: RunDir) -> dict:
    cfg = d.read_config()
    reducer = dict(cfg["reducer"])
    return {
        "name": cfg.get("name"),
        "model": cfg["model_name"],
        "data": cfg["data_name"],
        "nodes": int(cfg["nodes"]),
        "reducer": cfg["reducer_name"],
        "density": float(reducer["density"]) if "density" in reducer else None,
        "label": curve_label(cfg["reducer_name"], reducer, int(cfg["nodes"])),
        "reducer_cfg": reducer,  # what its class declares (analysis.reducers); not saved (common.save)
        "image_size": (cfg.get("data") or {}).get("image_size"),
        "batch": int(cfg["batch_size"]) * int(cfg.get("grad_accum", 1)),
        "seed": cfg.get("seed"),
        "run_dir": str(d.path),
    }


def load_curves(roots: Sequence[str | Path]) -> pd.DataFrame:
    """One row per recorded epoch of every training run under ``roots`` (running ones
    too): the run's identity (``seed`` included), ``epoch``, ``iterations`` (done at the
    epoch's end, from rank 0's rows), ``train_loss``, ``test_loss``, ``test_top1``,
    ``epoch_coverage`` (the coverage so far where the epoch's row carries it), and the run's
    ``coverage`` and ``still_rising`` (``analysis.training.regime``)."""
    rows = []
    for d in run_dirs(roots):
        epochs = [e for e in read_jsonl(d.epochs) if "test_top1" in e]
        if not epochs:
            continue
        iters = list(read_jsonl(d.iters(0)))
        meta, done = {**_run_meta(d), **regime(d, iters, epochs)}, iterations_by_epoch(iters)
        for e in epochs:
            if int(e["epoch"]) in done:
                rows.append({**meta, **{k: e[k] for k in ("epoch", "train_loss", "test_loss", "test_top1")}})
                rows[-1].update(iterations=done[int(e["epoch"])], epoch_coverage=e.get("coverage"))
    return pd.DataFrame(rows)


def _exact(row: pd.Series) -> bool:
    """The run's update is the exact average (dense S-SGD, DDP): the table's baseline."""
    return declared(row["reducer"], row.get("reducer_cfg")).exact_average


def _spread(values: list) -> str:
    return " / ".join(str(v) for v in values)


def _median_to(hits: list) -> int | str:
    """The median over seeds of iterations (or epochs) to target, ``not reached`` when most
    seeds did not reach it."""
    med = statistics.median([math.inf if h == NOT_REACHED else h for h in hits])
    return NOT_REACHED if math.isinf(med) else int(med) if float(med).is_integer() else med


def _trend(runs: list[pd.Series]) -> str:
    words = [trend_word(None if pd.isna(r["still_rising"]) else bool(r["still_rising"])) for r in runs]
    return words[0] if len(set(words)) == 1 else f"still rising in {words.count('still rising')}/{len(words)} seeds"


def table(curves: pd.DataFrame, relative: float = 0.99) -> pd.DataFrame:
    """One row per curve label at a model, data, image size, batch per worker and P: its
    runs (``runs``, ``seeds``) differ only in their seed. Final top-1: ``final_top1`` (mean
    over the seeds), ``final_top1_min``/``_max``; ``best_top1`` (over all); the dense runs'
    final top-1 (median over every dense run and seed) at the same key, the target
    (``relative`` x that), ``iterations_to_target_per_seed`` (`` / ``-separated, in seed
    order; ``not reached`` where a seed's run never got there) and ``iterations_to_target``
    / ``epochs_to_target`` (the median over the seeds; ``not reached`` where most did not;
    empty where there is no dense run); ``coverage`` (mean of the seeds' final coverage,
    empty where a run's records cannot give it) and ``trend`` (``still rising`` / ``flat``
    at the end, or how many seeds were still rising when they disagree)."""
    out = []
    keys = ["model", "data", "image_size", "nodes", "batch"]
    for _, group in curves.groupby(keys, sort=True, dropna=False):
        runs = {rd: run.sort_values("epoch") for rd, run in group.groupby("run_dir", sort=False)}
        dense = [run.iloc[-1]["test_top1"] for run in runs.values() if _exact(run.iloc[-1])]
        target = relative * statistics.median(dense) if dense else None
        by_label: dict[str, list[pd.DataFrame]] = {}
        for run in runs.values():
            by_label.setdefault(run.iloc[-1]["label"], []).append(run)
        for label in sorted(by_label):
            seeds = sorted(by_label[label], key=lambda r: (pd.isna(r.iloc[-1]["seed"]), r.iloc[-1]["seed"]))
            lasts = [r.iloc[-1] for r in seeds]
            its, eps = [], []
            for run in seeds:
                hit = run[run["test_top1"] >= target] if target is not None else run.iloc[0:0]
                its.append(int(hit.iloc[0]["iterations"]) if len(hit) else NOT_REACHED)
                eps.append(int(hit.iloc[0]["epoch"]) + 1 if len(hit) else NOT_REACHED)
            finals = [float(last["test_top1"]) for last in lasts]
            covs = [last["coverage"] for last in lasts]
            row = {k: lasts[0][k] for k in ("name", *keys, "reducer", "density", "label")}
            row.update(
                runs=len(seeds),
                seeds=_spread(["" if pd.isna(last["seed"]) else int(last["seed"]) for last in lasts]),
                epochs=max(int(last["epoch"]) + 1 for last in lasts),
                iterations=max(int(last["iterations"]) for last in lasts),
                final_top1=statistics.mean(finals),
                final_top1_min=min(finals),
                final_top1_max=max(finals),
                best_top1=max(float(r["test_top1"].max()) for r in seeds),
                dense_final_top1=statistics.median(dense) if dense else None,
                target_top1=target,
                iterations_to_target=_median_to(its) if target is not None else None,
                iterations_to_target_per_seed=_spread(its) if target is not None else None,
                epochs_to_target=_median_to(eps) if target is not None else None,
                coverage=None if any(pd.isna(c) for c in covs) else statistics.mean(covs),
                trend=_trend(lasts),
            )
            out.append(row)
    return pd.DataFrame(out)


def load_gap(roots: Sequence[str | Path]) -> pd.DataFrame:
    """One row per iteration of every training run: ``update_nnz`` (coordinates the update
    wrote: equal on every rank), ``residual_norm`` as the median, min and max over the
    ranks, and ``lost_l1`` summed over the ranks (each rank reports the merges it owns)."""
    rows = []
    for d in run_dirs(roots):
        if not read_jsonl(d.epochs):
            continue
        meta = _run_meta(d)
        per_rank = [pd.DataFrame(read_jsonl(p)) for p in d.all_iters()]
        per_rank = [f for f in per_rank if not f.empty and "iter" in f]
        if not per_rank:
            continue
        frame = pd.concat(per_rank, ignore_index=True)
        frame = frame.drop_duplicates(["rank", "iter"], keep="last")  # a resumed iteration's latest attempt
        for col in GAP:
            if col not in frame:
                frame[col] = float("nan")
        agg = frame.groupby("iter").agg(
            update_nnz=("update_nnz", "max"),
            residual_norm=("residual_norm", "median"),
            residual_norm_min=("residual_norm", "min"),
            residual_norm_max=("residual_norm", "max"),
            lost_l1=("lost_l1", lambda s: s.sum(min_count=1)),
            epoch=("epoch", "max"),
        )
        for it, r in agg.iterrows():
            rows.append({**meta, "iteration": int(it), **r.to_dict()})
    return pd.DataFrame(rows)


def _top1(r: pd.Series) -> str:
    if r["runs"] == 1:
        return f"{r['final_top1']:.3f}"
    return f"{r['final_top1']:.3f} ({r['final_top1_min']:.3f}-{r['final_top1_max']:.3f})"


def _blank(value) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def markdown(tab: pd.DataFrame) -> str:
    """The table as markdown, one row per curve label (its seeds together)."""
    head = (
        "| model | P | curve | seeds | final top-1, mean (min-max) | best top-1 | iterations to 99 % of dense, "
        "per seed | median | epochs to it | coverage | top-1 at the end |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in tab.iterrows():
        cov = "" if pd.isna(r["coverage"]) else f"{r['coverage']:.3g}"
        to = [_blank(r[c]) for c in ("iterations_to_target_per_seed", "iterations_to_target", "epochs_to_target")]
        lines.append(
            f"| {r['model']} | {int(r['nodes'])} | {r['label']} | {r['seeds']} | {_top1(r)} | {r['best_top1']:.3f} | "
            f"{' | '.join(to)} | {cov} | {r['trend']} |"
        )
    return "\n".join(lines) + "\n"
