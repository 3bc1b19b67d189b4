"""Does it pay off on my network? Time to a target accuracy per reducer, from measured
convergence (training runs) and the time per iteration (measured, else the calibrated model).

    python -m analysis.payoff RUNS... [--network PROFILE.json ...] [--target-acc 0.95] [--out DIR]

time_to_target = iterations_to_target (``analysis.training``: from the training runs at
that P) x t_iter (``analysis.payoff.itertime``: same model, reducer and per-worker batch;
measured by a benchmark job on that network, else modelled), for every model and density,
P = 1 .. 1024 (powers of 2, and any P trained), every network (the calibrated profiles and
a bandwidth sweep at their alpha), compute profile and target (``--relative`` x dense's
final accuracy at that P, and each ``--target-acc``). DDP's update is dense's: without a
DDP training run it takes the dense runs' iterations (``iterations_detail`` says so).
A P with no training run is ``no run``; with ``--borrow`` it takes the iterations of the
nearest trained P (in log2 P, ties to the smaller) and is marked ``borrowed``. Seeds,
``budget-limited`` cells and the density picked per reducer: ``analysis.payoff.cells``.
Writes payoff.csv, payoff_best.csv (each reducer at its best trained density), a map per
model and compute profile (``analysis.payoff.maps``), payoff_verdicts.txt and
payoff_versus.{csv,md} (each reducer against each payoff baseline per trained P and network,
with each t_iter's source: ``analysis.payoff.versus``) into ``<first RUN>/analysis/`` (or
--out). See docs/payoff.md.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis.payoff import versus
from analysis.payoff.cells import best_rows, pick_density, seeds_reach
from analysis.payoff.itertime import ComputeProfile, IterTimes, Net, Reducer, compute_profile, networks
from analysis.payoff.maps import write_maps
from analysis.payoff.verdict import CELL, SETUP, best_verdicts, fastest, verdicts
from analysis.reducers import conf_reducers, payoff_baselines, reference_baseline
from analysis.training import Target, TrainRun, load_train_runs
from gtopk.perf.netprofile import NetworkProfile
from gtopk.records.compute_profiles import LOCAL_PROFILE

NODES = tuple(2**i for i in range(11))  # 1 .. 1024
#: this machine's runs: make reproduce-fig6's (1 Gbit/s), make validate-model's (100 Mbit/s and 1 Gbit/s)
DEFAULT_RUNS = ("runs/fig6_reproduce", "runs/model_validation")
DEFAULT_PROFILES = tuple(f"{r}/net/*/profile.json" for r in DEFAULT_RUNS)


def donor(P: int, trained: Sequence[int], borrow: bool) -> int | None:
    """The trained P whose iterations P uses: P itself, else (``borrow``) the nearest in
    log2 P (ties to the smaller), else None."""
    if P in trained:
        return P
    if not borrow or not trained:
        return None
    return min(sorted(trained), key=lambda q: abs(math.log2(q) - math.log2(P)))


Key = tuple  # (reducer label, density or None): one line of the analysis


def reducers(runs: Sequence[TrainRun]) -> tuple[dict[Key, Reducer], dict[Key, list[TrainRun]], dict[Key, str]]:
    """Per (label, density): the Reducer (config, fallback overheads of its run with the
    fewest workers, one rank's: ``Reducer.trained``), its runs, and where its iterations
    come from; the reference baseline (DDP, ``analysis.reducers.reference_baseline``) added
    when it was not trained, with the runs of the reducers whose update is also the exact
    average (dense's)."""
    by: dict[Key, list[TrainRun]] = defaultdict(list)
    for r in runs:
        by[r.label, r.density].append(r)
    reds = {key: Reducer.trained(key[0], rs[0].reducer_cfg, min(rs, key=lambda r: r.nodes)) for key, rs in by.items()}
    origin = {key: "training run" for key in by}
    dense = [r for r in runs if r.exact_average]
    ref = reference_baseline()
    if ref is not None and (ref, None) not in by and dense:
        cfg = dict(conf_reducers()[ref])
        reds[ref, None] = Reducer.trained(ref, cfg, min(dense, key=lambda r: r.nodes))
        by[ref, None] = dense
        origin[ref, None] = "dense training run (same update)"
    return reds, by, origin


def iterations_cell(runs: Sequence[TrainRun], P: int, src: int | None, acc: float | None, origin: str) -> dict:
    """iterations_to_target at P of one reducer (``runs``: its runs at the donor P ``src``,
    one per seed; ``analysis.payoff.cells.seeds_reach``), with its source (measured |
    borrowed | none), detail and status (reached | budget-limited | not reached | no run)."""
    none = {"iterations_to_target": math.nan, "iterations_source": "none", "seeds": len(runs)}
    if not runs:
        return {
            **none,
            "status": "no run",
            "iterations_detail": "no training run at this P"
            if src is None
            else f"no training run of this reducer at P={src}" + (" (the nearest trained P)" if src != P else ""),
        }
    if acc is None:
        return {**none, "status": "no run", "iterations_detail": f"no dense run at P={src}: no relative target"}
    cell = seeds_reach(runs, acc)
    note = cell.pop("note")
    if cell["status"] != "reached":
        return {**cell, **none, "iterations_detail": f"{origin}, P={src}: {cell['status']}, {note}"}
    return {
        **cell,
        "iterations_source": "measured" if src == P else "borrowed",
        "iterations_detail": f"{origin}, P={src}: {note}",
    }


def time_source(iterations_source: str, t_iter_source: str) -> str:
    """none if either part is missing; measured if both are; else borrowed or modelled."""
    if "none" in (iterations_source, t_iter_source):
        return "none"
    if iterations_source == "borrowed":
        return "borrowed"
    return "measured" if t_iter_source == "measured" else "modelled"


def setup_rows(
    runs: Sequence[TrainRun],
    targets: Sequence[Target],
    nets: Sequence[Net],
    computes: Sequence[ComputeProfile],
    times: IterTimes,
    borrow: bool,
) -> list[dict]:
    """Every row of one setup (runs of one model, data, batch and accumulation): per P,
    target, reducer, network and compute profile; a reducer without a density (dense, DDP)
    appears under every density trained."""
    r0 = runs[0]
    head = dict(zip(SETUP, r0.setup))
    reds, by, origin = reducers(runs)
    trained = sorted({r.nodes for r in runs})
    densities = sorted({r.density for r in runs if r.density is not None}) or [1.0]  # dense reads 1.0
    rows = []
    for P in sorted(set(NODES) | set(trained)):
        src = donor(P, trained, borrow)
        for target in targets:
            acc = target.accuracy([r for r in runs if r.nodes == src])
            for key, red in reds.items():
                cell = iterations_cell([r for r in by[key] if r.nodes == src], P, src, acc, origin[key])
                dens = densities if key[1] is None else [key[1]]
                for net in nets:
                    for comp in computes:
                        t, t_src, t_det = times.t_iter(r0.model, r0.params, red, P, r0.batch, r0.accum, net, comp)
                        row = {**head, "nodes": P, "network": net.name, "bandwidth_gbps": net.gbps}
                        row.update(calibrated=net.calibrated, compute_profile=comp.name, target=target.name)
                        row.update(
                            target_acc=acc,
                            reducer=red.label,
                            iterations_from_nodes=src,
                            borrowed=src not in (None, P),
                            **cell,
                        )
                        row.update(t_iter=t, t_iter_source=t_src, t_iter_detail=t_det)
                        for col in ("to_target", "min", "max"):
                            its = cell.get(f"iterations_{col}", math.nan)
                            row[f"time_{col}"] = its * t if t is not None and its == its else math.nan
                        row["time_source"] = time_source(cell["iterations_source"], t_src)
                        row["reducer_density"] = key[1]
                        if cell["status"] == "reached" and t is None:
                            row["status"] = "no time"
                        rows += [{**row, "density": d} for d in dens]
    return rows


#: payoff.csv's last columns: the seeds' spread, the regime, the density picked (analysis.payoff.cells)
SEED_COLUMNS = ["seeds", "iterations_per_seed", "iterations_min", "iterations_max", "time_min", "time_max"]
SEED_COLUMNS += ["coverage", "still_rising", "reducer_density", "picked"]


def with_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Adds ``speedup_vs_<baseline>`` = that baseline's time_to_target / the row's, per cell,
    for every payoff baseline (``analysis.reducers.payoff_baselines``: DDP, DDP-fp16,
    PowerSGD); NaN where that baseline has no time (DDP-fp16 and PowerSGD need their own
    training runs: their updates are not dense's)."""
    out = df
    for base in payoff_baselines():
        t = df[df["reducer"] == base][CELL + ["time_to_target"]].rename(columns={"time_to_target": "base_time"})
        out = out.merge(t, on=CELL, how="left")
        out[f"speedup_vs_{base}"] = out["base_time"] / out["time_to_target"]
        out = out.drop(columns=["base_time"])
    return out


def payoff_table(
    runs: Sequence[TrainRun],
    targets: Sequence[Target],
    nets: Sequence[Net],
    computes: Sequence[ComputeProfile],
    times: IterTimes,
    borrow: bool = False,
) -> pd.DataFrame:
    """payoff.csv: one row per (setup, density, P, network, compute profile, target, reducer)."""
    groups: dict[tuple, list[TrainRun]] = defaultdict(list)
    for r in runs:
        groups[r.setup].append(r)
    rows = [row for key in sorted(groups) for row in setup_rows(groups[key], targets, nets, computes, times, borrow)]
    front = CELL + ["reducer", "status", "iterations_to_target", "t_iter", "time_to_target"]
    if not rows or any(c not in pd.DataFrame(rows).columns for c in front + SEED_COLUMNS[:6] + ["still_rising"]):
        raise SystemExit(
            "no time to a target can be computed from these runs: the default target is 99 % of dense's accuracy, "
            "and no setup holds a dense run beside its sparse ones; train dense at the same P too, or give "
            "--target-acc A (an absolute top-1)"
        )
    df = pick_density(with_speedups(pd.DataFrame(rows)))
    front += [f"speedup_vs_{b}" for b in payoff_baselines()]
    return df[front + [c for c in df.columns if c not in front + SEED_COLUMNS] + SEED_COLUMNS]


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked (one-line errors naming the option and the fix)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="folders holding the training runs (e.g. runs/fig5_quick)")
    ap.add_argument(
        "--network",
        action="append",
        help=f"network profile(s) (netbench profile.json, or `paper`); default {', '.join(DEFAULT_PROFILES)}, "
        "calibrated first (reproduce-fig6's netbench step) when none exists",
    )
    ap.add_argument(
        "--bench",
        action="append",
        help="folders of benchmark jobs whose t_iter counts as measured, or `none` (every t_iter modelled) "
        "(default: the folder two levels above each network profile, e.g. runs/fig6_reproduce, "
        f"and those of {', '.join(DEFAULT_RUNS)} that exist)",
    )
    ap.add_argument(
        "--compute",
        action="append",
        help="compute profiles: p102, local or a local.json-format file "
        f"(default p102, and local when {LOCAL_PROFILE} exists)",
    )
    ap.add_argument(
        "--target-acc", action="append", type=float, default=[], help="an absolute top-1 target (repeatable)"
    )
    ap.add_argument(
        "--relative", type=float, default=0.99, help="relative target: x dense's final top-1 (default 0.99)"
    )
    ap.add_argument(
        "--borrow", action="store_true", help="untrained P take the nearest trained P's iterations (marked)"
    )
    ap.add_argument("--out", help="output folder (default: <first RUN>/analysis)")
    args = ap.parse_args(argv)
    for root in args.runs:
        if not Path(root).is_dir():
            raise SystemExit(f"RUNS: {root} is not a folder; run `make reproduce-fig5` first or name the runs' folder")
    for acc in [args.relative, *args.target_acc]:
        if not 0 < acc <= 1:
            raise SystemExit(f"--target-acc/--relative {acc} is outside (0, 1]; give a top-1 fraction, e.g. 0.95")
    if not args.network:
        args.network = default_profiles()
    if args.bench and "none" in args.bench:
        if len(args.bench) > 1:
            raise SystemExit("--bench none: it means no benchmark jobs; give it alone, or folders without it")
        args.bench = []
    if args.bench is None:  # the jobs measured on each profile's network, and make validate-model's
        near = {str(Path(n).parents[2]) for n in args.network if n != "paper" and len(Path(n).parents) > 2}
        args.bench = sorted(near | {r for r in DEFAULT_RUNS if Path(r).is_dir()})
    args.compute = args.compute or ["p102"] + (["local"] if LOCAL_PROFILE.exists() else [])
    return args


def default_profiles() -> list[str]:
    """This machine's calibrated profiles, one per cluster setting (reproduce-fig6's first);
    when there is none, calibrate the emulated 1 Gbit/s network as ``make reproduce-fig6``
    does (its folder, so that reproduce-fig6 reuses it; loopback with a warning where
    namespaces cannot be built)."""
    found: dict[str, str] = {}
    for p in (p for pattern in DEFAULT_PROFILES for p in sorted(Path().glob(pattern))):
        found.setdefault(json.dumps(NetworkProfile.load(p).cluster, sort_keys=True), str(p))
    if found:
        return list(found.values())
    from analysis.reproduce import DEFAULTS, calibrate, merged, pick_cluster

    print("no calibrated network profile yet: calibrating this machine's emulated network first", flush=True)
    _, net = calibrate(pick_cluster(merged(DEFAULTS, [])), [])
    return [str(net / "profile.json")]


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    runs, skipped = load_train_runs(args.runs)
    for line in skipped:
        print(f"left out: {line}")
    if not runs:
        raise SystemExit(f"no finished training runs (epochs.jsonl + summary.json) under {' '.join(args.runs)}")
    nets = networks([NetworkProfile.load(n) for n in args.network])
    targets = [Target(relative=args.relative)] + [Target(absolute=a) for a in args.target_acc]
    computes = [compute_profile(c) for c in args.compute]
    df = payoff_table(runs, targets, nets, computes, IterTimes(args.bench), args.borrow)
    out = Path(args.out) if args.out else Path(args.runs[0]) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "payoff.csv", index=False)
    best = best_rows(df)
    best.to_csv(out / "payoff_best.csv", index=False)
    cells = fastest(df)
    best_cells = fastest(best, [c for c in CELL if c != "density"])
    paths = [out / "payoff.csv", out / "payoff_best.csv", *write_maps(cells, out, best_cells)]
    lines = verdicts(df, cells) + best_verdicts(best, best_cells)
    against = versus.versus(best)
    against.to_csv(out / "payoff_versus.csv", index=False)
    (out / "payoff_versus.md").write_text(versus.markdown(against))
    paths += [out / "payoff_versus.csv", out / "payoff_versus.md"]
    (out / "payoff_verdicts.txt").write_text("".join(f"{text}\n" for _, text in lines))
    paths.append(out / "payoff_verdicts.txt")
    for p in paths:
        print(f"wrote {p}")
    print(f"\nverdicts on the calibrated network(s) (all {len(lines)} in payoff_verdicts.txt):")
    for calibrated, text in lines:
        if calibrated:
            print(f"  {text}")


if __name__ == "__main__":
    main()
