"""``make reproduce-scale``'s analysis: Fig. 5 at scale on the runs of
``experiment=fig5_scale`` as they stand (trained job by job by the Makefile target)."""

from __future__ import annotations

import sys
import time

from analysis.reproduce import publish, steps
from analysis.reproduce.sweep import ROOT, axis, first_job, merged

#: analysis.figures.scale's grid options and the sweep keys they come from; where its copies go
SCALE_GRID = (("nodes", "nodes"), ("reducers", "reducer"), ("seeds", "seed"))
SCALE_RESULTS = ROOT / "analysis" / "results" / "fig5_scale"


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
    steps.run([sys.executable, "-m", "analysis.figures.scale", str(runs), *grid, "--publish", str(SCALE_RESULTS)])


PAPER_LENGTH_RESULTS = ROOT / "analysis" / "results" / "fig5_paper_length"
#: the network the paper-length payoff is priced on: the emulated 1 Gbit/s cluster's calibration
PAYOFF_NETWORK = ROOT / "analysis" / "results" / "network_profile" / "emulated_1gbit.json"


def paper_length(overrides: list[str]) -> None:
    """Fig. 5 at the paper's training length on the runs of ``experiment=fig5_paper_length``
    as they stand (``make reproduce-paper-length``; a partial grid too): the table, curves
    and cells (``analysis.figures.scale --stem fig5_paper_length``), and the gap to dense
    against coverage along training beside the grid's budget (``analysis.figures.budgets``:
    the archived ``fig5_scale`` runs), published to ``analysis/results/fig5_paper_length/``;
    ``make payoff``'s verdicts at this length on the calibrated 1 Gbit/s profile
    (``PAYOFF_NETWORK``), every t_iter modelled (``--bench none``: no benchmark job left in
    this clone's runs/ decides a published number), published beside them; then the README's answer table
    (``analysis.readme``)."""
    given = list(overrides)
    overrides = merged(["experiment=fig5_paper_length"], overrides)
    runs = first_job(overrides)[0]
    grid: list[str] = []
    for flag, key in SCALE_GRID:
        grid += [f"--{flag}", *axis(overrides, key)]
    stem = "fig5_paper_length"
    steps.run([sys.executable, "-m", "analysis.figures.scale", str(runs), *grid, "--stem", stem,
               "--publish", str(PAPER_LENGTH_RESULTS)])  # fmt: skip
    steps.run([sys.executable, "-m", "analysis.figures.budgets", f"grid={SCALE_RESULTS / 'runs'}",
               f"paper_length={runs}", "--nodes", *axis(overrides, "nodes"), "--reducers", *axis(overrides, "reducer"),
               "--stem", f"{stem}_budgets", "--out", str(PAPER_LENGTH_RESULTS)])  # fmt: skip
    started = time.time()
    steps.run([sys.executable, "-m", "analysis.payoff", str(runs), "--network", str(PAYOFF_NETWORK),
               "--bench", "none", "--out", str(runs / "analysis")])  # fmt: skip
    publish.publish(
        publish.destination(overrides, "fig5_paper_length", runs),
        publish.outputs_of(runs / "analysis", ["payoff_verdicts", "payoff_versus"]),
        publish.command("paper_length", [], given),
        since=started,
        inputs={"network_profile.json": PAYOFF_NETWORK},
        run_roots=[runs],
    )
    steps.run([sys.executable, "-m", "analysis.readme"])  # the README's answer table from the new table
