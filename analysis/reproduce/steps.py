"""The steps every ``make reproduce-*`` target shares: run a command (echoed, exit on its
failure), pick the cluster, calibrate its network once per cluster setting, export to wandb.

The targets call ``steps.run`` through this module (never a copy of the name), so that a test
that replaces ``analysis.reproduce.steps.run`` sees every command a target would run."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from analysis.reproduce.sweep import axis, first_job, keys
from gtopk.perf.netprofile import NetworkProfile


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


def ring_nodes(overrides: list[str]) -> list[int]:
    """Every P the sweep runs with more than one rank: where netbench measures the ring step."""
    return sorted({int(P) for P in axis(overrides, "nodes") if int(P) > 1})


def covers(profile: Path, nodes: list[int]) -> bool:
    """Whether a saved profile has the ring step measured at every P of ``nodes``."""
    if not profile.exists():
        return False
    measured = NetworkProfile.load(profile).ring_alpha_at
    return all(str(P) in measured for P in nodes)


def calibrate(overrides: list[str], netbench: list[str], beyond: list[int] = ()) -> tuple[Path, Path]:
    """(the sweep directory, the folder of its network profile): ``gtopk.perf.netbench``
    ping-pong on the cluster of the sweep's first job, with the ring step at every P the
    sweep runs and at ``beyond`` (``--full``'s P); measured once per cluster setting, again
    when a sweep has a P it lacks."""
    runs, cluster_name, cluster_cfg = first_job(overrides)
    nb_args, nb_name = cluster_args(cluster_name, cluster_cfg)
    net = runs / "net" / nb_name
    nodes = sorted(set(ring_nodes(overrides)) | {int(P) for P in beyond})
    if not covers(net / "profile.json", nodes):
        run(
            [
                sys.executable,
                "-m",
                "gtopk.perf.netbench",
                *nb_args,
                "collectives.nodes=[]",
                f"ring.nodes=[{','.join(map(str, nodes))}]",
                f"name={cluster_name}",
                f"out={net}",
                *netbench,
            ]
        )
    return runs, net
