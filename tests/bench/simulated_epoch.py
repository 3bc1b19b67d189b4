"""Epoch time of ``cluster=simulated`` over P, batched and exact (``cluster.batched``).

``python -m tests.bench.simulated_epoch`` trains ResNet-20 on the digits at 8 x 8 pixels
(``experiment=fig5_quick``'s setup: gTop-k at rho = 0.001, two intra-op threads) at a
global batch of 128 (128 / P images per rank; one image per rank where P > 128, so the
global batch is P there) for ``--epochs`` epochs per P, in ``--mode`` batched, exact or
auto (each P in ``cluster.batched``'s default mode), each P in a fresh process or, with
``--together``, all in one process with their epochs interleaved (every row then sees the
same machine; the ratio to the first P is printed), and prints per row: the median epoch
time (the epoch's training steps and its
evaluation, no records or checkpoints; the first epoch, which warms up, is left out), its
parts (steps and evaluation), the steps per epoch, the process's peak RSS and the 1-minute
load average before and after. ``--no-eval`` times the steps only (P = 1,024: 360 test
images over 1,024 ranks would be 1,024 one-image passes). ``--image-size 32`` rescales the
digits to ``experiment=fig5_full``'s 32 x 32.

    python -m tests.bench.simulated_epoch --nodes 4 32 --mode auto --epochs 8 --together
    python -m tests.bench.simulated_epoch --nodes 1 4 16 32 256 --mode batched
    python -m tests.bench.simulated_epoch --nodes 4 32 --mode batched --image-size 32
    python -m tests.bench.simulated_epoch --nodes 4 32 --mode exact
    python -m tests.bench.simulated_epoch --nodes 1024 --mode batched --epochs 3 --no-eval
    python -m tests.bench.simulated_epoch --nodes 4 32 256 --mode auto --device cuda

``--device cuda`` runs the P ranks on one GPU with what ``mode=train`` sets there
(``gtopk.train.device.pick_device``: deterministic cuDNN and cuBLAS kernels), and
synchronises the GPU before each clock reading.
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
    """The job's overrides (the fig5 quick setup at P, ``mode`` batched, exact or auto,
    the digits rescaled to ``image_size``: 32 is fig5_full's)."""
    per_rank = max(1, GLOBAL_BATCH // P)
    batched = {"batched": "true", "exact": "false", "auto": "auto"}[mode]
    return [
        "experiment=fig5_quick",
        f"nodes={P}",
        f"batch_size={per_rank}",
        "reducer=gtopk",
        "logger.wandb=false",
        f"cluster.batched={batched}",
        f"cluster.chunk={'null' if chunk is None else chunk}",
        f"data.image_size={image_size}",
    ]


class EpochTimer:
    """One simulated worker of P ranks (``settings``) in this process; ``epoch()`` trains
    one more epoch and returns its (steps, evaluation) seconds."""

    def __init__(self, P: int, mode: str, chunk: int | None, image_size: int, run_dir: Path, device: str = "cpu"):
        from gtopk.simulated.ranks import SimulatedRanks
        from gtopk.simulated.worker import SimulatedWorker
        from gtopk.train.device import pick_device
        from gtopk.train.recipe import DensitySchedule, LRSchedule
        from tests.config import compose_config

        self.cfg = cfg = compose_config(settings(P, mode, chunk, image_size) + [f"device={device}"])
        self.device = pick_device(cfg, 0)
        self.w = SimulatedWorker(P, cfg, run_dir, self.device)
        self.ranks = SimulatedRanks(self.w)
        if mode != "auto":
            assert (self.w.batched is not None) == (mode == "batched")
        self.mode = "batched" if self.w.batched is not None else "exact"
        self.lr_at = LRSchedule(cfg.model.lr, P, cfg.model.lr_warmup_epochs, tuple(cfg.model.lr_milestones))
        self.density_at = DensitySchedule(
            cfg.density, cfg.train.density_warmup.density, cfg.train.density_warmup.epochs
        )
        self.per_epoch = len(self.w.ranks[0].train_loader)
        self.epochs = 0

    def epoch(self, evaluate: bool) -> tuple[float, float]:
        w, epoch = self.w, self.epochs
        for vr in w.ranks:
            vr.reducer.density = self.density_at(epoch)
        self._sync()
        t0 = time.perf_counter()
        streams = [vr.groups(epoch) for vr in w.ranks]
        for it in range(self.per_epoch):
            w.step([s.__next__ for s in streams], self.lr_at(epoch, it, self.per_epoch))
        self._sync()
        t1 = time.perf_counter()
        if evaluate:
            self.ranks.evaluate()
            self._sync()
        self.epochs += 1
        return t1 - t0, time.perf_counter() - t1

    def _sync(self) -> None:
        """Wait for the GPU's queued work before a clock reading (nothing on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.ranks.close()


def timed(
    Ps: list[int],
    mode: str,
    epochs: int,
    evaluate: bool,
    chunk: int | None,
    threads: int,
    image_size: int = 8,
    device: str = "cpu",
) -> list[dict]:
    """Train ``epochs`` epochs of each P in ``Ps`` in this process, round-robin (epoch e of
    every P before epoch e + 1 of any, so that all rows see the same machine); one dict of
    timings per P (medians over the epochs after the first)."""
    from gtopk.train.memory import peak_rss_mb, reset_peak_rss

    reset_peak_rss()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / str(P) for P in Ps]
        for d in dirs:
            d.mkdir()
        timers = [EpochTimer(P, mode, chunk, image_size, d, device) for P, d in zip(Ps, dirs)]
        torch.set_num_threads(threads or int(timers[0].cfg.threads_per_worker))
        parts: list[list[tuple[float, float]]] = [[] for _ in Ps]
        for _ in range(epochs):
            for t, got in zip(timers, parts):
                got.append(t.epoch(evaluate))
        for t in timers:
            t.close()
    timed_ = slice(1, None) if epochs > 1 else slice(None)
    out = []
    for P, t, got in zip(Ps, timers, parts):
        steps = [a for a, _ in got[timed_]]
        evals = [b for _, b in got[timed_]]
        epochs_s = [a + b for a, b in got[timed_]]
        out.append(
            {
                "P": P,
                "mode": t.mode,
                "batch_per_rank": int(t.cfg.batch_size),
                "steps_per_epoch": t.per_epoch,
                "epoch_s": statistics.median(epochs_s),
                "steps_s": statistics.median(steps),
                "eval_s": statistics.median(evals),
                "epochs_timed": len(steps),
                "peak_rss_mb": peak_rss_mb(),
                # the GPU's peak over every row of this process (its allocator's, not the driver's)
                "gpu_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16, 32, 256])
    ap.add_argument(
        "--mode", choices=["batched", "exact", "auto"], default="batched", help="auto: cluster.batched's default per P"
    )
    ap.add_argument("--epochs", type=int, default=4, help="epochs per (P, mode); the first is not timed")
    ap.add_argument("--chunk", type=int, default=64, help="ranks per batched pass (0: all)")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--image-size", type=int, default=8, help="pixels per side (8: fig5_quick's; 32: fig5_full's)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: the experiment's, 2)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the P ranks run")
    ap.add_argument(
        "--together",
        action="store_true",
        help="all --nodes in one process, their epochs interleaved; ratios to the first P",
    )
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: its --nodes in this process
    args = ap.parse_args()
    chunk = args.chunk or None
    if args.one:
        rows = timed(
            args.nodes, args.mode, args.epochs, not args.no_eval, chunk, args.threads, args.image_size, args.device
        )
        print(json.dumps(rows))
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    threads = args.threads or "the experiment's"
    how = "one process, epochs interleaved" if args.together else "a fresh process per P"
    print(
        f"commit {commit}, {os.cpu_count()} cores, {threads} threads, torch {torch.__version__}, {args.epochs} epochs/row, "
        f"{args.image_size} x {args.image_size} pixels, {how}, device {args.device}"
    )
    gpu = "  gpu_peak_mb" if args.device == "cuda" else ""
    print(f"   P  mode     img/rank  steps  epoch_s  steps_s  eval_s  peak_rss_mb  load_before  load_after{gpu}")
    groups = [args.nodes] if args.together else [[P] for P in args.nodes]
    first = None
    for Ps in groups:
        before = os.getloadavg()[0]
        cmd = [
            sys.executable,
            "-m",
            "tests.bench.simulated_epoch",
            "--one",
            "--nodes",
            *map(str, Ps),
            "--mode",
            args.mode,
        ]
        cmd += ["--epochs", str(args.epochs), "--chunk", str(args.chunk), "--threads", str(args.threads)]
        cmd += ["--image-size", str(args.image_size), "--device", args.device]
        cmd += ["--no-eval"] if args.no_eval else []
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            print(f"{Ps}  {args.mode:8s} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        for r in json.loads(done.stdout.strip().splitlines()[-1]):
            first = first or r
            gpu_mb = f" {r['gpu_peak_mb']:12.0f}" if r.get("gpu_peak_mb") is not None else ""
            ratio = (
                f"  {r['epoch_s'] / first['epoch_s']:.2f}x P = {first['P']}" if args.together and r is not first else ""
            )
            print(
                f"{r['P']:4d}  {r['mode']:8s} {r['batch_per_rank']:8d} {r['steps_per_epoch']:6d} {r['epoch_s']:8.2f} "
                f"{r['steps_s']:8.2f} {r['eval_s']:7.2f} {r['peak_rss_mb']:12.0f} {before:12.2f} {os.getloadavg()[0]:11.2f}"
                f"{gpu_mb}{ratio}",
                flush=True,
            )


if __name__ == "__main__":
    main()
