"""How far the payoff map can be trusted: t_iter predicted the way ``make payoff`` models it,
against t_iter measured, per network, P and reducer.

    python -m analysis.payoff.validate runs/model_validation --network NET1/profile.json --network NET2/profile.json

The jobs are benchmark jobs (``experiment=model_validation``: emulated cluster, p102 compute
replay). A job is matched to the profile whose cluster settings it ran on. Its prediction
is ``analysis.payoff.itertime``'s modelled path, never its measured shortcut: t_compute from the
compute profile (``--compute``, default p102) for the job's batch, t_data, t_compr and the
rest of the step from the reducer's job with the fewest workers (the P = 1 jobs: these
are the model's inputs and are not themselves validated), t_commu from the reducer's
alpha-beta formula on the profile's network. Writes ``validation.{csv,md}`` into
``<root>/analysis/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

from analysis.payoff.itertime import IterTimes, Net, Reducer, compute_profile, net_of_profile, ran_on
from analysis.reducers import declared
from analysis.training import reducer_label
from gtopk.perf.netprofile import NetworkProfile
from gtopk.records.rundir import finished

KEYS = ["bandwidth", "model", "nodes", "reducer"]


def net_of(summary: dict, profiles: list[NetworkProfile]) -> Net | None:
    """The profile (as payoff's ``Net``) whose every cluster setting the job's summary has."""
    prof = next((p for p in profiles if ran_on(summary, p.cluster)), None)
    return None if prof is None else net_of_profile(prof)


def ratio_row(summary: dict, pred: dict, overlaps_backward: bool) -> dict:
    """Measured (``summary``) beside predicted (``pred``: t_compute, t_commu, t_exposed,
    t_iter) for one job. t_commu measured is the whole collective: for a reducer that
    overlaps it with backward (DDP), ``t_commu_backward`` (its all-reduce window, hidden or
    not), which is what the model's t_commu stands for. rest = t_iter - t_compute - the
    communication the step waited for (``t_commu`` of the summary, the model's t_exposed: for
    a sequential reducer all of it, for an overlapping one what backward did not hide): t_data,
    t_compr, the update, flattening."""
    commu = summary["t_commu_backward"] if overlaps_backward else summary["t_commu"]
    return {
        "t_iter_measured": summary["t_iter"],
        "t_iter_predicted": pred["t_iter"],
        "ratio": pred["t_iter"] / summary["t_iter"],
        "t_compute_measured": summary["t_compute"],
        "t_compute_predicted": pred["t_compute"],
        "t_commu_measured": commu,
        "t_commu_predicted": pred["t_commu"],
        "commu_ratio": pred["t_commu"] / commu if commu > 0 else float("nan"),
        "rest_measured": summary["t_iter"] - summary["t_compute"] - summary["t_commu"],
        "rest_predicted": pred["t_iter"] - pred["t_compute"] - pred["t_exposed"],
    }


def validation_rows(root: str | Path, profiles: list[NetworkProfile], compute_arg: str = "p102") -> pd.DataFrame:
    """One row per finished benchmark job at P > 1 under ``root`` that ran on one of
    ``profiles``' clusters with the compute profile ``compute_arg``: measured beside what
    ``analysis.payoff`` would model for it (``IterTimes.modelled``, inputs from ``root`` only)."""
    times, compute = IterTimes([root]), compute_profile(compute_arg)
    rows = []
    for d in finished([root]):
        s, cfg = d.read_summary(), d.read_config()
        P, net = int(s["nodes"]), net_of(s, profiles)
        if s.get("mode") != "benchmark" or P < 2 or net is None or not compute.ran(s):
            continue
        reducer = Reducer(reducer_label(cfg["reducer_name"], dict(cfg["reducer"])), dict(cfg["reducer"]))
        batch, accum = int(s["batch_per_worker"]), int(s.get("grad_accum_steps", 1))
        pred, where = times.modelled(s["model"], int(s["params"]), reducer, P, batch, accum, net, compute)
        if pred is None:
            continue
        overlaps = declared(cfg["reducer_name"], reducer.cfg).overlaps_backward
        rows.append(
            {
                "bandwidth": net.cluster.get("bandwidth", net.name),
                "calibrated_gbps": net.gbps,
                "alpha_s": net.alpha,
                "software_s": net.software,
                "ring_alpha_s": net.profile.ring_step(P),
                "model": s["model"],
                "nodes": P,
                "reducer": reducer.label,
                **ratio_row(s, pred, overlaps),
                "inputs": where,
                "run_dir": str(d.path),
            }
        )
    df = pd.DataFrame(rows)
    return df.sort_values(KEYS, key=order).reset_index(drop=True) if rows else df


def order(col: pd.Series) -> pd.Series:
    """Sort key: bandwidths by their value (100mbit before 1gbit), the rest as they are."""
    if col.name != "bandwidth":
        return col
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    return col.map(lambda b: next((float(b[: -len(u)]) * f for u, f in units.items() if b.endswith(u)), 0.0))


#: the agreement asked of the model (docs/payoff.md): per bandwidth and P the median
#: predicted / measured t_iter within MEDIAN_BAND, every row within ROW_BAND
MEDIAN_BAND, ROW_BAND = (0.9, 1.1), (0.75, 1.33)


def markdown(df: pd.DataFrame) -> str:
    """The ratio table (times in ms), then per bandwidth and P the median and range of the
    t_iter ratios, the rows outside ``ROW_BAND`` and the median measured / predicted t_compute."""

    def ms(a: float, b: float) -> str:
        return f"{1e3 * a:.1f} / {1e3 * b:.1f}"

    lines = [
        "| bandwidth | model | P | reducer | t_iter measured (ms) | predicted (ms) | predicted / measured "
        "| t_compute meas / pred | t_commu meas / pred | rest meas / pred |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in df.iterrows():
        lines.append(
            f"| {r['bandwidth']} | {r['model']} | {r['nodes']} | {r['reducer']} | {1e3 * r['t_iter_measured']:.1f} | "
            f"{1e3 * r['t_iter_predicted']:.1f} | {r['ratio']:.2f} | "
            f"{ms(r['t_compute_measured'], r['t_compute_predicted'])} | "
            f"{ms(r['t_commu_measured'], r['t_commu_predicted'])} | {ms(r['rest_measured'], r['rest_predicted'])} |"
        )
    lo, hi = ROW_BAND
    lines += [
        "",
        f"| bandwidth | P | rows | predicted / measured t_iter: median | range | rows outside {lo}-{hi} "
        "| t_compute measured / predicted: median |",
        "|---|---|---|---|---|---|---|",
    ]
    for (bw, P), g in df.groupby(["bandwidth", "nodes"], sort=False):
        compute = statistics.median(g["t_compute_measured"] / g["t_compute_predicted"])
        outside = g[(g["ratio"] < lo) | (g["ratio"] > hi)]
        named = ", ".join(f"{r['model']} {r['reducer']} {r['ratio']:.2f}" for _, r in outside.iterrows()) or "none"
        lines.append(
            f"| {bw} | {P} | {len(g)} | {statistics.median(g['ratio']):.2f} | {g['ratio'].min():.2f} - "
            f"{g['ratio'].max():.2f} | {named} | {compute:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="folder of the validation jobs (e.g. runs/model_validation)")
    ap.add_argument("--network", action="append", required=True, help="network profile(s) the jobs ran on")
    ap.add_argument("--compute", default="p102", help="compute profile the jobs replayed (default p102)")
    ap.add_argument("--out", help="output folder (default <root>/analysis)")
    args = ap.parse_args(argv)
    if not Path(args.root).is_dir():
        raise SystemExit(f"root: {args.root} is not a folder; run `make validate-model` first")
    df = validation_rows(args.root, [NetworkProfile.load(n) for n in args.network], args.compute)
    if df.empty:
        raise SystemExit(f"no finished benchmark job at P > 1 under {args.root} ran on the given --network profiles")
    out = Path(args.out) if args.out else Path(args.root) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "validation.csv", index=False)
    (out / "validation.md").write_text(markdown(df))
    print(f"wrote {out / 'validation.csv'}\nwrote {out / 'validation.md'}\n\n{markdown(df)}")


if __name__ == "__main__":
    main()
