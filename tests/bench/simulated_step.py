"""Step time of ``cluster=simulated`` per reducer at P = 32: what a paper-length cell costs.

``python -m tests.bench.simulated_step`` builds one simulated worker per reducer with
``experiment=fig5_paper_length``'s settings (ResNet-20, 8 x 8 pixels, P = 32 ranks of 4
images, rho = 0.001 from the first step, one intra-op thread) in this process, then times
their steps round-robin: ``--rounds`` rounds of ``--steps`` steps of each reducer in turn,
so that every reducer sees the same machine. The first round warms up and is not timed.
It prints, per reducer, the median step (``SimulatedWorker.step``: the P gradients, the
aggregate, the SGD step; no records, checkpoints or evaluation), the medians of its parts
from the step's rows (t_compute, t_compr, the shared t_update) summed over the ranks, and
the ratio of its median to dense's. The data: Fashion-MNIST where Debian's package is
installed, else the offline digits (``--data``), both 8 x 8 and one channel.

    python -m tests.bench.simulated_step                      # dense, gtopk, gtopk_exact, topk
    python -m tests.bench.simulated_step --reducers dense gtopk --rounds 6 --steps 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

REDUCERS = ("dense", "gtopk", "gtopk_exact", "topk")


def default_data() -> str:
    """fashion_mnist where its files are, else digits (same shapes at 8 x 8)."""
    from tests.config import compose_config

    root = compose_config(["data=fashion_mnist"]).data.root
    return "fashion_mnist" if Path(root).is_dir() else "digits"


class StepTimer:
    """One simulated worker (``reducer`` at ``P``) in this process; ``steps(n)`` times n steps."""

    def __init__(self, reducer: str, P: int, data: str, run_dir: Path):
        from gtopk.simulated.worker import SimulatedWorker
        from gtopk.train.device import pick_device
        from tests.config import compose_config

        overrides = [
            "experiment=fig5_paper_length",
            f"nodes={P}",
            f"reducer={reducer}",
            f"data={data}",
            "data.image_size=8",
            "train.density_warmup.epochs=0",
            "device=cpu",
        ]
        self.cfg = cfg = compose_config(overrides)
        self.w = SimulatedWorker(P, cfg, run_dir, pick_device(cfg, 0))
        self.streams = [vr.groups(None) for vr in self.w.ranks]  # endless: no epoch boundary
        self.lr = float(cfg.model.lr) / 10

    def steps(self, n: int) -> tuple[list[float], list[dict[str, float]]]:
        """n steps: each one's wall seconds and its parts (summed over the ranks)."""
        times, parts = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            rows = self.w.step([s.__next__ for s in self.streams], self.lr)
            times.append(time.perf_counter() - t0)
            parts.append(
                {
                    "t_data": sum(r["t_data"] for r in rows),
                    "t_compute": sum(r["t_compute"] for r in rows),
                    "t_compr": sum(r["t_compr"] for r in rows),
                    "t_update": rows[0]["t_update"],
                }
            )
        return times, parts

    def close(self) -> None:
        for vr in self.w.ranks:
            vr.records.close()


def measure(reducers: list[str], P: int, rounds: int, steps: int, data: str, threads: int) -> list[dict]:
    """Round-robin step times of ``reducers`` (``rounds`` x ``steps`` each; round 0 not
    timed); one dict per reducer: median step and parts (seconds), steps timed."""
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        timers = []
        for name in reducers:
            d = Path(tmp) / name
            d.mkdir()
            timers.append(StepTimer(name, P, data, d))
        got: list[list[float]] = [[] for _ in reducers]
        parts: list[list[dict]] = [[] for _ in reducers]
        for r in range(rounds):
            for t, g, p in zip(timers, got, parts):
                times, rows = t.steps(steps)
                if r > 0:
                    g.extend(times)
                    p.extend(rows)
        for t in timers:
            t.close()
    out = []
    for name, g, p in zip(reducers, got, parts):
        row = {"reducer": name, "step_s": statistics.median(g), "steps": len(g)}
        row.update({k: statistics.median(x[k] for x in p) for k in p[0]})
        out.append(row)
    return out


def table(rows: list[dict]) -> list[str]:
    """The printed lines: medians in ms and each reducer's ratio to the first (dense)."""
    base = rows[0]["step_s"]
    lines = [
        f"{'reducer':12s} {'step_ms':>8s} {'/' + rows[0]['reducer']:>8s} {'compute':>8s} {'compr':>7s} {'update':>7s} {'data':>6s}  steps"
    ]
    for r in rows:
        lines.append(
            f"{r['reducer']:12s} {r['step_s'] * 1e3:8.1f} {r['step_s'] / base:8.2f} {r['t_compute'] * 1e3:8.1f} "
            f"{r['t_compr'] * 1e3:7.1f} {r['t_update'] * 1e3:7.1f} {r['t_data'] * 1e3:6.1f}  {r['steps']}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reducers", nargs="+", default=list(REDUCERS), help="the first is the ratios' base")
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of --steps steps per reducer; the first warms up")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--data", choices=["fashion_mnist", "digits"], default=None)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (fig5_paper_length's: 1)")
    args = ap.parse_args()
    data = args.data or default_data()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    print(
        f"commit {commit}, {os.cpu_count()} cores, {args.threads} thread(s), torch {torch.__version__}, P = {args.nodes}, "
        f"{data} 8 x 8, {args.rounds - 1} x {args.steps} timed steps per reducer, round-robin; load {load:.1f} before"
    )
    rows = measure(args.reducers, args.nodes, args.rounds, args.steps, data, args.threads)
    for line in table(rows):
        print(line)
    print(f"load {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
