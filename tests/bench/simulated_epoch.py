"""Epoch time of ``cluster=simulated`` over P, batched and exact (``cluster.batched``).

``python -m tests.bench.simulated_epoch`` trains ResNet-20 on the digits at 8 x 8 pixels
(``experiment=fig5_quick``'s setup: gTop-k at rho = 0.001, two intra-op threads) at a
global batch of 128 (128 / P images per rank; one image per rank where P > 128, so the
global batch is P there) for ``--epochs`` epochs per (P, mode), each (P, mode) in a fresh
process, and prints per row: the median epoch time (the epoch's training steps and its
evaluation, no records or checkpoints; the first epoch, which warms up, is left out), its
parts (steps and evaluation), the steps per epoch, the process's peak RSS and the 1-minute
load average before and after. ``--no-eval`` times the steps only (P = 1,024: 360 test
images over 1,024 ranks would be 1,024 one-image passes). ``--image-size 32`` rescales the
digits to ``experiment=fig5_full``'s 32 x 32.

    python -m tests.bench.simulated_epoch --nodes 1 4 16 32 256 --mode batched
    python -m tests.bench.simulated_epoch --nodes 4 32 --mode batched --image-size 32
    python -m tests.bench.simulated_epoch --nodes 4 32 --mode exact
    python -m tests.bench.simulated_epoch --nodes 1024 --mode batched --epochs 3 --no-eval
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

GLOBAL_BATCH = 128


def settings(P: int, mode: str, chunk: int | None, image_size: int = 8) -> list[str]:
    """The job's overrides (the fig5 quick setup at P, ``mode`` batched or exact, the
    digits rescaled to ``image_size``: 32 is fig5_full's)."""
    per_rank = max(1, GLOBAL_BATCH // P)
    return [
        "experiment=fig5_quick",
        f"nodes={P}",
        f"batch_size={per_rank}",
        "reducer=gtopk",
        "logger.wandb=false",
        f"cluster.batched={'true' if mode == 'batched' else 'false'}",
        f"cluster.chunk={'null' if chunk is None else chunk}",
        f"data.image_size={image_size}",
    ]


def one(P: int, mode: str, epochs: int, evaluate: bool, chunk: int | None, threads: int, image_size: int = 8) -> dict:
    """Train ``epochs`` epochs in this process; the timings as a dict."""
    from gtopk.train.memory import peak_rss_mb, reset_peak_rss
    from gtopk.train.recipe import DensitySchedule, LRSchedule
    from gtopk.train.virtual import SimulatedWorker
    from tests.config import compose_config

    cfg = compose_config(settings(P, mode, chunk, image_size))
    torch.set_num_threads(threads or int(cfg.threads_per_worker))
    reset_peak_rss()
    with tempfile.TemporaryDirectory() as run_dir:
        w = SimulatedWorker(P, cfg, Path(run_dir), torch.device("cpu"))
        assert (w.batched is not None) == (mode == "batched")
        lr_at = LRSchedule(cfg.model.lr, P, cfg.model.lr_warmup_epochs, tuple(cfg.model.lr_milestones))
        density_at = DensitySchedule(cfg.density, cfg.train.density_warmup.density, cfg.train.density_warmup.epochs)
        per_epoch = len(w.ranks[0].train_loader)
        steps, evals = [], []
        for epoch in range(epochs):
            for vr in w.ranks:
                vr.reducer.density = density_at(epoch)
            t0 = time.perf_counter()
            streams = [vr.groups(epoch) for vr in w.ranks]
            for it in range(per_epoch):
                w.step([s.__next__ for s in streams], lr_at(epoch, it, per_epoch))
            t1 = time.perf_counter()
            if evaluate:
                w.evaluate()
            steps.append(t1 - t0)
            evals.append(time.perf_counter() - t1)
        for vr in w.ranks:
            vr.iters.close()
    timed = slice(1, None) if epochs > 1 else slice(None)
    step_s, eval_s = statistics.median(steps[timed]), statistics.median(evals[timed])
    return {
        "P": P,
        "mode": mode,
        "batch_per_rank": int(cfg.batch_size),
        "steps_per_epoch": per_epoch,
        "epoch_s": step_s + eval_s,
        "steps_s": step_s,
        "eval_s": eval_s,
        "epochs_timed": len(steps[timed]),
        "peak_rss_mb": peak_rss_mb(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16, 32, 256])
    ap.add_argument("--mode", choices=["batched", "exact"], default="batched")
    ap.add_argument("--epochs", type=int, default=4, help="epochs per (P, mode); the first is not timed")
    ap.add_argument("--chunk", type=int, default=64, help="ranks per batched pass (0: all)")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--image-size", type=int, default=8, help="pixels per side (8: fig5_quick's; 32: fig5_full's)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: the experiment's, 2)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one (P, mode)
    args = ap.parse_args()
    chunk = args.chunk or None
    if args.one:
        print(
            json.dumps(
                one(args.nodes[0], args.mode, args.epochs, not args.no_eval, chunk, args.threads, args.image_size)
            )
        )
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    threads = args.threads or "the experiment's"
    print(
        f"commit {commit}, {os.cpu_count()} cores, {threads} threads, torch {torch.__version__}, {args.epochs} epochs/row, "
        f"{args.image_size} x {args.image_size} pixels"
    )
    print("   P  mode     img/rank  steps  epoch_s  steps_s  eval_s  peak_rss_mb  load_before  load_after")
    for P in args.nodes:
        before = os.getloadavg()[0]
        cmd = [sys.executable, "-m", "tests.bench.simulated_epoch", "--one", "--nodes", str(P), "--mode", args.mode]
        cmd += ["--epochs", str(args.epochs), "--chunk", str(args.chunk), "--threads", str(args.threads)]
        cmd += ["--image-size", str(args.image_size)] + (["--no-eval"] if args.no_eval else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            print(f"{P:4d}  {args.mode:8s} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{P:4d}  {r['mode']:8s} {r['batch_per_rank']:8d} {r['steps_per_epoch']:6d} {r['epoch_s']:8.2f} "
            f"{r['steps_s']:8.2f} {r['eval_s']:7.2f} {r['peak_rss_mb']:12.0f} {before:12.2f} {os.getloadavg()[0]:11.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
