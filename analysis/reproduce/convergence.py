"""``make reproduce-fig5``: train the plan of ``fig5_plan`` (digits or Fashion-MNIST, quick
or ``--full``), then draw Fig. 5, its table and gap diagnostics."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from analysis.reducers import names, ordered
from analysis.reproduce import publish, steps
from analysis.reproduce.sweep import ROOT, axis, first_job, keys, merged


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
    t0, started = time.monotonic(), time.time()
    roots: list[Path] = []
    for sweep in fig5_sweeps(overrides, full, data):
        steps.run([sys.executable, str(ROOT / "run.py"), "-m", *sweep])
        root = first_job(sweep)[0]
        roots += [] if root in roots else [root]
    steps.run([sys.executable, "-m", "analysis.figures.fig5", str(roots[0])])
    if len(roots) > 1:  # gTop-k's density sensitivity, beside the dense runs of the same P
        steps.run(
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
    steps.export(*roots)
    density = [roots[1] / "analysis"] if len(roots) > 1 else []
    found = publish.outputs_of(roots[0] / "analysis", ["fig5", "fig5_table", "fig5_gap", "gap_coverage"])
    for folder in density:
        found |= publish.outputs_of(folder, ["density", "density_table", "density_gap", "density_gap_coverage"])
    flags = (["--full"] if full else []) + ["--data", data]
    publish.publish(
        publish.destination(overrides, roots[0].name, roots[0]),
        found,
        publish.command("fig5", flags, overrides),
        since=started,
        run_roots=roots,
    )
    outputs = "fig5.{png,pdf,csv}, fig5_table.{csv,md}, fig5_gap.{png,pdf,csv}, gap_coverage.{png,pdf,csv}"
    print(f"\nfig5: {time.monotonic() - t0:.0f} s. Outputs in {roots[0] / 'analysis'}/: {outputs}", flush=True)
    if len(roots) > 1:
        print(f"density sensitivity: {roots[1] / 'analysis'}/density.*, density_table.*, density_gap*", flush=True)
