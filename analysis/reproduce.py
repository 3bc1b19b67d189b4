"""The ``make reproduce-*`` targets: run the experiments, then the analysis scripts.

    python -m analysis.reproduce fig6|table4|breakdown|scaling [--full] [--netbench "K=V ..."] [--variants K=V,...] [HYDRA OVERRIDES...]
    python -m analysis.reproduce fig5 [--full] [--data digits|fashion] [HYDRA OVERRIDES...]
    python -m analysis.reproduce validate [--netbench "K=V ..."] [HYDRA OVERRIDES...]
    python -m analysis.reproduce scale [HYDRA OVERRIDES...]

* scaling targets (fig6, table4, breakdown; ``scaling`` makes all three) share the runs of
  ``runs/fig6_reproduce/``: the cluster (``pick_cluster``: emulated where it can be built,
  else loopback with a warning), the netbench calibration once per cluster setting
  (``calibrate``), ``run.py -m experiment=fig6_reproduce`` and each ``--variants`` sweep
  (``variant_sweeps``), with ``--full`` then each P beyond (16, 32) over the models whose P
  ranks fit (``analysis.memfit``), the analysis scripts with the calibrated profile, the wandb export;
* fig5 trains the plan of ``fig5_plan`` (digits or Fashion-MNIST, quick or ``--full``);
* validate runs ``experiment=model_validation`` and ``analysis.payoff.validate``;
* scale analyses the runs of ``experiment=fig5_scale`` as they stand.

What each step runs, its outputs and its time: docs/reproducing.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser

from analysis import memfit
from analysis.reducers import conf_reducers, names, ordered

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ["experiment=fig6_reproduce"]  # the sweep axes are in the experiment's hydra.sweeper.params


def fig5_plan(data: str, full: bool) -> list[list[str]]:
    """The sweeps of fig5 for ``data`` and ``full``, each a list of overrides (conf/experiment/:
    the sweep axes are in each file); the first sweep's folder gets the analysis, a second
    one of another experiment gets the density analysis beside the first one's dense runs.
    Fashion's quick variant adds, by what the reducer classes declare (``analysis.reducers``,
    in plot order): the simulatable exact-average reducers once per P (dense), two more seeds
    of those and of the experiment's reducer axis at the paper's density (dense, Top-k,
    gTop-k and its exact put-back), and the hook baselines (DDP-fp16, PowerSGD)."""
    if data == "digits":
        return [["experiment=fig5_full"], ["experiment=fig5_density"]] if full else [["experiment=fig5_quick"]]
    if full:
        return [["experiment=fig5_fashion_paper"]]
    exact = names(lambda d: d.simulatable and d.exact_average and not d.payoff_baseline)
    quick = "experiment=fig5_fashion_quick"
    seeds = ordered(exact + axis([quick], "reducer"))
    hooks = names(lambda d: d.payoff_baseline and not d.exact_average)
    return [
        [quick],  # the sparse reducers at three densities
        [quick, f"reducer={','.join(exact)}", "density=0.001"],  # dense once per P
        [quick, "density=0.001", "seed=1,2", f"reducer={','.join(seeds)}"],  # two more seeds, P = 4 and 16
        ["experiment=fig5_fashion_baselines", f"reducer={','.join(hooks)}"],  # P = 4 real processes, 3 seeds
    ]


#: settings the scaling targets also run as lines of their own (``variant_sweeps``): each over
#: the reducers of the sweep whose yaml has the key (the sampled threshold: Top-k, gTop-k,
#: Ok-Topk), labelled by it in the figures (``gtopk selection=sampled``)
VARIANTS = (("selection", "sampled"),)

SCALING_SCRIPTS = {
    "fig6": ["fig6", "table4", "breakdown", "commmodel"],  # one run, every scaling output
    "table4": ["table4"],
    "breakdown": ["breakdown"],
    "scaling": ["fig6", "table4", "breakdown", "commmodel"],
}


def keys(overrides: list[str]) -> set[str]:
    """The config keys (or groups) that overrides set."""
    return {o.key_or_group for o in OverridesParser.create().parse_overrides(overrides)}


def merged(defaults: list[str], overrides: list[str]) -> list[str]:
    """``defaults`` whose key ``overrides`` does not set, then ``overrides``."""
    given = keys(overrides)
    return [d for d in defaults if d.split("=", 1)[0] not in given] + list(overrides)


def run(cmd: list[str]) -> None:
    """Run a command from the repository, echoed; exit with its status if it fails."""
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    rc = subprocess.call(cmd, cwd=Path.cwd())
    if rc:
        raise SystemExit(f"failed (exit {rc}): {' '.join(cmd[:4])} ...")


def export(*roots: Path) -> None:
    """Every finished job and analysis folder under ``roots`` -> wandb runs, offline unless
    the user is logged in (``analysis.wandb.export``): after the timed jobs, never in them."""
    os.environ.setdefault("WANDB_MODE", "offline")  # make wandb-sync uploads them
    run([sys.executable, "-m", "analysis.wandb.export", *map(str, roots)])


def pick_cluster(overrides: list[str]) -> list[str]:
    """Overrides plus ``cluster=local`` when no cluster was chosen and this machine cannot
    build the emulated one."""
    if "cluster" in keys(overrides):
        return overrides
    from gtopk.run.cluster.netns import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        return overrides
    print(
        f"WARNING: cannot emulate the 1 Gbit/s cluster here ({reason}); running on loopback "
        "(cluster=local): this machine's own interconnect, not the paper's network",
        file=sys.stderr,
        flush=True,
    )
    return overrides + ["cluster=local"]


def cluster_args(cluster_name: str, cluster_cfg: dict) -> tuple[list[str], str]:
    """netbench overrides that build the same cluster, and a folder name for its profile."""
    settings = {k: v for k, v in cluster_cfg.items() if k != "_target_"}
    args = [f"cluster={cluster_name}"] + [f"cluster.{k}={v}" for k, v in settings.items()]
    return args, "_".join([cluster_name] + [f"{k}-{v}" for k, v in settings.items()])


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


def calibrate(overrides: list[str], netbench: list[str]) -> tuple[Path, Path]:
    """(the sweep directory, the folder of its network profile): ``gtopk.perf.netbench``
    ping-pong on the cluster of the sweep's first job, measured once per cluster setting."""
    runs, cluster_name, cluster_cfg = first_job(overrides)
    nb_args, nb_name = cluster_args(cluster_name, cluster_cfg)
    net = runs / "net" / nb_name
    if not (net / "profile.json").exists():
        run(
            [
                sys.executable,
                "-m",
                "gtopk.perf.netbench",
                *nb_args,
                "collectives.nodes=[]",
                f"name={cluster_name}",
                f"out={net}",
                *netbench,
            ]
        )
    return runs, net


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


def validate(overrides: list[str], netbench: list[str]) -> None:
    """The performance model against measurement (``experiment=model_validation``): a
    calibration at each bandwidth of the sweep, the sweep, then ``analysis.payoff.validate`` with
    every profile, and the wandb export."""
    from gtopk.run.cluster.netns import unavailable_reason

    reason = unavailable_reason()
    if reason is not None and "cluster" not in keys(overrides):
        raise SystemExit(f"validate-model needs the emulated cluster (its bandwidths are the point): {reason}")
    t0 = time.monotonic()
    overrides = merged(["experiment=model_validation"], overrides)
    profiles, runs = [], Path()
    for bandwidth in axis(overrides, "cluster.bandwidth"):
        at = [o for o in overrides if "cluster.bandwidth" not in keys([o])] + [f"cluster.bandwidth={bandwidth}"]
        runs, net = calibrate(at, netbench)
        profiles += ["--network", str(net / "profile.json")]
    run([sys.executable, str(ROOT / "run.py"), "-m", *overrides])
    run([sys.executable, "-m", "analysis.payoff.validate", str(runs), *profiles])
    export(runs)
    print(
        f"\nvalidate: {time.monotonic() - t0:.0f} s. Outputs in {runs / 'analysis'}/: validation.{{csv,md}}", flush=True
    )


def variant_sweeps(overrides: list[str], variants=VARIANTS) -> list[list[str]]:
    """The ``run.py -m`` argument lists that run each (key, value) of ``variants`` over the
    reducers of the sweep (``axis``) whose ``conf/reducer`` yaml has the key, with the
    sweep's other axes; none for a setting no reducer of the sweep has."""
    sweeps = []
    reducers = axis(overrides, "reducer")
    for key, value in variants:
        having = [r for r in reducers if key in conf_reducers().get(r, {})]
        if having:
            sweeps.append(merged(overrides, [f"reducer={','.join(having)}", f"reducer.{key}={value}"]))
    return sweeps


def scaling(target: str, overrides: list[str], netbench: list[str], variants=(), full: bool = False) -> None:
    """Steps 1-4 of the module docstring for a scaling target, the ``variants`` swept after
    the experiment (``variant_sweeps``); ``full``: then each P beyond the experiment's
    (``memfit.split``), its ``run.py -m`` over the models that fit, decided just before it
    (``memfit.sweep_at``), with its variants."""
    t0 = time.monotonic()
    overrides = pick_cluster(merged(DEFAULTS, overrides))
    runs, net = calibrate(overrides, netbench)
    base, beyond = memfit.split(overrides, axis) if full else (overrides, [])
    for nodes in [None, *beyond]:
        at = base if nodes is None else memfit.sweep_at(overrides, nodes, runs, axis)
        for sweep in [at, *variant_sweeps(at, variants)] if at else []:
            run([sys.executable, str(ROOT / "run.py"), "-m", *sweep])
    for script in SCALING_SCRIPTS[target]:
        run([sys.executable, "-m", f"analysis.figures.{script}", str(runs), "--network", str(net / "profile.json")])
    export(runs)
    outputs = [f"{s}.csv, {s}.md" if s == "table4" else f"{s}.{{png,pdf,csv}}" for s in SCALING_SCRIPTS[target]]
    print(
        f"\n{target}: {time.monotonic() - t0:.0f} s. Outputs in {runs / 'analysis'}/: {'; '.join(outputs)}. "
        f"Runs in {runs}/, network profile {net / 'profile.json'}",
        flush=True,
    )


def fig5_sweeps(overrides: list[str], full: bool, data: str) -> list[list[str]]:
    """The ``run.py -m`` argument lists of fig5 (``fig5_plan``), with the user's overrides; a
    dense pass (an extra sweep that sets ``reducer``) is left out when the overrides set the
    reducer themselves."""
    sweeps = fig5_plan(data, full)
    if "reducer" in keys(overrides):
        sweeps = [s for s in sweeps if not any(o.startswith("reducer=") for o in s)]
    return [merged(s, overrides) for s in sweeps]


def fig5(overrides: list[str], full: bool, data: str = "digits") -> None:
    """Train the Fig. 5 runs (``run.py -m``), plot them with their table, gap diagnostics and
    gap against coverage, export them to wandb: the quick variant, or with ``full`` the full
    one, on ``data`` (digits or fashion)."""
    t0 = time.monotonic()
    roots: list[Path] = []
    for sweep in fig5_sweeps(overrides, full, data):
        run([sys.executable, str(ROOT / "run.py"), "-m", *sweep])
        root = first_job(sweep)[0]
        roots += [] if root in roots else [root]
    run([sys.executable, "-m", "analysis.figures.fig5", str(roots[0])])
    if len(roots) > 1:  # gTop-k's density sensitivity, beside the dense runs of the same P
        run(
            [
                sys.executable,
                "-m",
                "analysis.figures.fig5",
                str(roots[1]),
                "--dense-from",
                str(roots[0]),
                "--stem",
                "density",
            ]
        )
    export(*roots)
    outputs = "fig5.{png,pdf,csv}, fig5_table.{csv,md}, fig5_gap.{png,pdf,csv}, gap_coverage.{png,pdf,csv}"
    print(f"\nfig5: {time.monotonic() - t0:.0f} s. Outputs in {roots[0] / 'analysis'}/: {outputs}", flush=True)
    if len(roots) > 1:
        print(f"density sensitivity: {roots[1] / 'analysis'}/density.*, density_table.*, density_gap*", flush=True)


def scale(overrides: list[str]) -> None:
    """Fig. 5 at scale on the runs of ``experiment=fig5_scale`` (trained by ``make
    reproduce-scale``; a partial grid too): ``analysis.figures.scale`` with the grid the
    experiment sweeps (its P, reducers and seeds: the missing cells are named), its outputs in
    ``<runs>/analysis/`` and their CSV, PNG and markdown copied to ``analysis/results/fig5_scale/``
    with a provenance file."""
    overrides = merged(["experiment=fig5_scale"], overrides)
    runs = first_job(overrides)[0]
    grid: list[str] = []
    for flag, key in SCALE_GRID:
        grid += [f"--{flag}", *axis(overrides, key)]
    run([sys.executable, "-m", "analysis.figures.scale", str(runs), *grid, "--publish", str(SCALE_RESULTS)])


#: analysis.figures.scale's grid options and the sweep keys they come from; where its copies go
SCALE_GRID = (("nodes", "nodes"), ("reducers", "reducer"), ("seeds", "seed"))
SCALE_RESULTS = ROOT / "analysis" / "results" / "fig5_scale"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", choices=sorted([*SCALING_SCRIPTS, "fig5", "validate", "scale"]))
    ap.add_argument(
        "--full",
        action="store_true",
        help="fig5: the full variant (P = 4, 16, 32; three densities); scaling targets: also P = 16, 32 "
        "for the models whose ranks fit in memory (analysis.memfit), the rest modelled",
    )
    ap.add_argument(
        "--data",
        choices=["digits", "fashion"],
        default="digits",
        help="fig5: the offline digits (default) or Fashion-MNIST (Debian's dataset-fashion-mnist)",
    )
    ap.add_argument("--netbench", default="", help='extra gtopk.perf.netbench overrides, e.g. "pingpong.reps=3"')
    ap.add_argument(
        "--variants",
        default="",
        help="scaling targets: reducer settings also run as lines of their own, KEY=VALUE,... over the "
        "reducers of the sweep whose yaml has KEY (e.g. "
        + ",".join(f"{k}={v}" for k, v in VARIANTS)
        + ", the sampled threshold; default none: each variant adds a sweep to the target's time)",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the runs")
    args = ap.parse_intermixed_args(argv)
    if args.target == "fig5":
        fig5(args.overrides, args.full, args.data)
    elif args.target == "validate":
        validate(args.overrides, shlex.split(args.netbench))
    elif args.target == "scale":
        scale(args.overrides)
    else:
        variants = [tuple(v.split("=", 1)) for v in args.variants.split(",") if "=" in v]
        scaling(args.target, args.overrides, shlex.split(args.netbench), variants, args.full)


if __name__ == "__main__":
    main()
