"""What Fig. 5 plots, from the records of training runs (``mode=train``): the curves per
epoch and per iteration, the table beside them, and the per-iteration gap diagnostics.

A curve is one run: its reducer (``gtopk_exact`` is gTop-k with the exact put-back), rho
where the reducer sparsifies, P. The table gives, per curve, the final top-1 and the
iterations it needed to reach 99 % of the final top-1 of the dense run of the same
experiment, model, data and P (epoch resolution, as ``analysis.training.iterations_to``
counts them), or "not reached".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis.training import DENSE, iterations_by_epoch, reducer_label
from gtopk.records.rundir import RunDir, read_jsonl, run_dirs

NOT_REACHED = "not reached"
#: per-iteration diagnostics of the reducers (gtopk.reducers.base.ReduceRecord)
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
        "image_size": (cfg.get("data") or {}).get("image_size"),
        "batch": int(cfg["batch_size"]) * int(cfg.get("grad_accum", 1)),
        "run_dir": str(d.path),
    }


def load_curves(roots: Sequence[str | Path]) -> pd.DataFrame:
    """One row per recorded epoch of every training run under ``roots`` (running ones
    too): the run's identity, ``epoch``, ``iterations`` (done at the epoch's end, from
    rank 0's rows), ``train_loss``, ``test_loss``, ``test_top1``."""
    rows = []
    for d in run_dirs(roots):
        epochs = [e for e in read_jsonl(d.epochs) if "test_top1" in e]
        if not epochs:
            continue
        meta, done = _run_meta(d), iterations_by_epoch(read_jsonl(d.iters(0)))
        for e in epochs:
            if int(e["epoch"]) in done:
                rows.append({**meta, **{k: e[k] for k in ("epoch", "train_loss", "test_loss", "test_top1")}})
                rows[-1]["iterations"] = done[int(e["epoch"])]
    return pd.DataFrame(rows)


def table(curves: pd.DataFrame, relative: float = 0.99) -> pd.DataFrame:
    """Per curve: final top-1 (its last epoch), best top-1, the dense runs' final top-1
    (median) at the same model, data, image size, batch per worker and P, the target (``relative`` x that), and the
    iterations and epochs to reach it (``not reached`` where no epoch did; empty where
    there is no dense run to compare with)."""
    out = []
    keys = ["model", "data", "image_size", "nodes", "batch"]
    for _, group in curves.groupby(keys, sort=True, dropna=False):
        runs = {rd: run.sort_values("epoch") for rd, run in group.groupby("run_dir", sort=False)}
        dense = [run.iloc[-1]["test_top1"] for run in runs.values() if run.iloc[-1]["reducer"] in DENSE]
        target = relative * statistics.median(dense) if dense else None
        for run in sorted(runs.values(), key=lambda r: r.iloc[-1]["label"]):
            last = run.iloc[-1]
            hit = run[run["test_top1"] >= target] if target is not None else run.iloc[0:0]
            row = {k: last[k] for k in ("name", *keys, "reducer", "density", "label")}
            row.update(
                epochs=int(last["epoch"]) + 1,
                iterations=int(last["iterations"]),
                final_top1=float(last["test_top1"]),
                best_top1=float(run["test_top1"].max()),
                dense_final_top1=statistics.median(dense) if dense else None,
                target_top1=target,
                iterations_to_target=(int(hit.iloc[0]["iterations"]) if len(hit) else NOT_REACHED)
                if target is not None
                else None,
                epochs_to_target=(int(hit.iloc[0]["epoch"]) + 1 if len(hit) else NOT_REACHED)
                if target is not None
                else None,
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


def markdown(tab: pd.DataFrame) -> str:
    """The table as markdown, one row per curve."""
    head = "| model | P | curve | final top-1 | best top-1 | iterations to 99 % of dense | epochs to it |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for _, r in tab.iterrows():
        lines.append(
            f"| {r['model']} | {int(r['nodes'])} | {r['label']} | {r['final_top1']:.3f} | {r['best_top1']:.3f} | "
            f"{r['iterations_to_target']} | {r['epochs_to_target']} |"
        )
    return "\n".join(lines) + "\n"
