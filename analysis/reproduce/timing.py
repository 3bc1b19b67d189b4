"""The scaling targets (fig6, table4, breakdown; ``scaling`` makes all three): the timed
jobs of ``runs/fig6_reproduce/`` and the scripts that draw them (docs/reproducing.md, "What
``make reproduce-fig6`` does", steps 1-4)."""

from __future__ import annotations

import sys
import time

from analysis import memfit
from analysis.reducers import conf_reducers, reference_baseline
from analysis.reproduce import publish, steps
from analysis.reproduce.sweep import ROOT, axis, merged

DEFAULTS = ["experiment=fig6_reproduce"]  # the sweep axes are in the experiment's hydra.sweeper.params

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


def v1_sweep(overrides: list[str]) -> list[list[str]]:
    """The ``run.py -m`` argument lists of the v_1 jobs (``analysis.scaling.baseline_v1``):
    the reference baseline's (DDP's: plain single-worker SGD at P = 1) P = 1 job of each model,
    where the sweep has P = 1 but not that reducer. Fig. 6's lines are the paper's three
    methods; every line's e(P) is over one single-worker throughput per model, as the paper's."""
    ref = reference_baseline()
    if ref is None or "1" not in axis(overrides, "nodes") or ref in axis(overrides, "reducer"):
        return []
    return [merged(overrides, ["nodes=1", f"reducer={ref}"])]


def results_name(runs, overrides: list[str], full: bool = False) -> str:
    """The ``analysis/results/`` folder a scaling run publishes to: ``fig6`` for the runs of
    ``experiment=fig6_reproduce`` (another ``name=``: that name), ``_baselines`` for
    ``experiment=fig6_baselines``, ``_full`` with ``--full``."""
    name = "fig6" if runs.name == DEFAULTS[0].split("=")[1] else runs.name
    experiment = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "experiment"]
    if experiment and experiment[-1] != DEFAULTS[0].split("=")[1]:
        name += "_" + experiment[-1].removeprefix("fig6_")
    return name + ("_full" if full else "")


def scaling(target: str, overrides: list[str], netbench: list[str], variants=(), full: bool = False) -> None:
    """Steps 1-4 of docs/reproducing.md ("What make reproduce-fig6 does") for a scaling
    target, the v_1 jobs (``v1_sweep``) and the ``variants`` (``variant_sweeps``) swept after
    the experiment; ``full``: then
    each P beyond the experiment's (``memfit.split``), its ``run.py -m`` over the models that
    fit, decided just before it (``memfit.sweep_at``), with its variants."""
    t0, started = time.monotonic(), time.time()
    given = list(overrides)
    overrides = steps.pick_cluster(merged(DEFAULTS, overrides))
    base, beyond = memfit.split(overrides, axis) if full else (overrides, [])
    runs, net = steps.calibrate(overrides, netbench, beyond)
    for nodes in [None, *beyond]:
        at = base if nodes is None else memfit.sweep_at(overrides, nodes, runs, axis)
        for sweep in [at, *v1_sweep(at), *variant_sweeps(at, variants)] if at else []:
            steps.run([sys.executable, str(ROOT / "run.py"), "-m", *sweep])
    for script in SCALING_SCRIPTS[target]:
        steps.run(
            [sys.executable, "-m", f"analysis.figures.{script}", str(runs), "--network", str(net / "profile.json")]
        )
    steps.export(runs)
    stems = SCALING_SCRIPTS[target] + ([memfit.CSV.removesuffix(".csv")] if full else [])
    publish.publish(
        publish.destination(overrides, results_name(runs, overrides, full), runs),
        publish.outputs_of(runs / "analysis", stems),
        publish.command(target, ["--full"] if full else [], given),
        since=started,
        inputs={"network_profile.json": net / "profile.json"},
        run_roots=[runs],
    )
    outputs = [f"{s}.csv, {s}.md" if s == "table4" else f"{s}.{{png,pdf,csv}}" for s in SCALING_SCRIPTS[target]]
    print(
        f"\n{target}: {time.monotonic() - t0:.0f} s. Outputs in {runs / 'analysis'}/: {'; '.join(outputs)}. "
        f"Runs in {runs}/, network profile {net / 'profile.json'}",
        flush=True,
    )
