"""The ``make reproduce-*`` targets: run the experiments, then the analysis scripts.

    python -m analysis.reproduce fig6|table4|breakdown|scaling [--full] [--netbench "K=V ..."] [--variants K=V,...] [HYDRA OVERRIDES...]
    python -m analysis.reproduce fig5 [--full] [--data digits|fashion] [HYDRA OVERRIDES...]
    python -m analysis.reproduce validate [--full] [--netbench "K=V ..."] [HYDRA OVERRIDES...]
    python -m analysis.reproduce scale [HYDRA OVERRIDES...]

* scaling targets (fig6, table4, breakdown; ``scaling`` makes all three; ``timing.py``) share
  the runs of ``runs/fig6_reproduce/``: the cluster (``pick_cluster``: emulated where it can be
  built, else loopback with a warning), the netbench calibration once per cluster setting
  (``calibrate``), ``run.py -m experiment=fig6_reproduce``, the v_1 jobs (``v1_sweep``) and each
  ``--variants`` sweep (``variant_sweeps``), with ``--full`` then each P beyond (16, 32) over the models whose P
  ranks fit (``analysis.memfit``), the analysis scripts with the calibrated profile, the wandb export;
* fig5 (``convergence.py``) trains the plan of ``fig5_plan`` (digits or Fashion-MNIST, quick or ``--full``);
* validate (``validation.py``) runs ``experiment=model_validation`` (``--full``: then P = 16, 32
  where the ranks fit) and ``analysis.payoff.validate``;
* scale (``at_scale.py``) analyses the runs of ``experiment=fig5_scale`` as they stand.

The shared pieces: ``sweep.py`` (what a ``run.py -m`` sweep is: ``keys``, ``merged``, ``axis``,
``first_job``) and ``steps.py`` (``run``, ``pick_cluster``, ``calibrate``, ``export``); the command
line is ``cli.py`` (``main``), ``__main__.py`` runs it. The targets call the steps through their
module, so a test replaces a step there (``monkeypatch.setattr(steps, "run", ...)``); ``run`` and
``export`` are deliberately not re-exported here, so that patching ``analysis.reproduce.run``
fails instead of missing the targets' calls.

What each step runs, its outputs and its time: docs/reproducing.md.
"""

from __future__ import annotations

from analysis.reproduce.at_scale import SCALE_GRID, SCALE_RESULTS, scale
from analysis.reproduce.cli import main
from analysis.reproduce.convergence import fig5, fig5_plan, fig5_sweeps
from analysis.reproduce.steps import calibrate, cluster_args, pick_cluster
from analysis.reproduce.sweep import ROOT, axis, first_job, first_values, keys, merged
from analysis.reproduce.timing import DEFAULTS, SCALING_SCRIPTS, VARIANTS, scaling, v1_sweep, variant_sweeps
from analysis.reproduce.validation import validate

__all__ = [
    "DEFAULTS",
    "ROOT",
    "SCALE_GRID",
    "SCALE_RESULTS",
    "SCALING_SCRIPTS",
    "VARIANTS",
    "axis",
    "calibrate",
    "cluster_args",
    "first_job",
    "first_values",
    "fig5",
    "fig5_plan",
    "fig5_sweeps",
    "keys",
    "main",
    "merged",
    "pick_cluster",
    "scale",
    "scaling",
    "validate",
    "v1_sweep",
    "variant_sweeps",
]
