"""``make validate-model``: the performance model against measurement
(``experiment=model_validation``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from analysis import memfit
from analysis.reproduce import publish, steps
from analysis.reproduce.sweep import ROOT, axis, keys, merged


def validate(overrides: list[str], netbench: list[str], full: bool = False) -> None:
    """The performance model against measurement (``experiment=model_validation``): a
    calibration at each bandwidth of the sweep, the sweep, with ``full`` then each P beyond it
    (16, 32: ``memfit.split``) as a sweep of its own over the models whose ranks fit
    (``memfit.sweep_at``, decided just before it), then ``analysis.payoff.validate`` with every
    profile, and the wandb export."""
    from gtopk.run.cluster.netns import unavailable_reason

    reason = unavailable_reason()
    if reason is not None and "cluster" not in keys(overrides):
        raise SystemExit(f"validate-model needs the emulated cluster (its bandwidths are the point): {reason}")
    t0, started = time.monotonic(), time.time()
    given = list(overrides)
    overrides = merged(["experiment=model_validation"], overrides)
    profiles, runs, nets = [], Path(), {}
    base, beyond = memfit.split(overrides, axis) if full else (overrides, [])
    for bandwidth in axis(overrides, "cluster.bandwidth"):
        at = [o for o in overrides if "cluster.bandwidth" not in keys([o])] + [f"cluster.bandwidth={bandwidth}"]
        runs, net = steps.calibrate(at, netbench, beyond)
        profiles += ["--network", str(net / "profile.json")]
        nets[f"network_profile_{bandwidth}.json"] = net / "profile.json"
    for nodes in [None, *beyond]:
        sweep = base if nodes is None else memfit.sweep_at(overrides, nodes, runs, axis)
        if sweep:
            steps.run([sys.executable, str(ROOT / "run.py"), "-m", *sweep])
    steps.run([sys.executable, "-m", "analysis.payoff.validate", str(runs), *profiles])
    steps.export(runs)
    publish.publish(
        publish.destination(overrides, "model_validation", runs),
        publish.outputs_of(runs / "analysis", ["validation"]),
        publish.command("validate", ["--full"] if full else [], given),
        since=started,
        inputs=nets,
        run_roots=[runs],
    )
    print(
        f"\nvalidate: {time.monotonic() - t0:.0f} s. Outputs in {runs / 'analysis'}/: validation.{{csv,md}}", flush=True
    )
