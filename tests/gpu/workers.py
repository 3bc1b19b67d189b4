"""Worker functions of the GPU tier (module level: spawned ranks import them)."""

from __future__ import annotations

import torch

from gtopk.perf import netbench
from gtopk.train.loop import run_worker
from gtopk.train.worker import Worker


def timed_job(rank: int, world: int, cfg: dict, run_dir: str) -> dict:
    """``run_worker`` with each step also timed by CUDA events on the rank's GPU:
    ``{"summary": rank 0's summary, "steps": [(t_iter by the host clock, event seconds)]}``."""
    steps: list[tuple[float, float]] = []
    step = Worker.step

    def timed(self, fetch, lr):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        row = step(self, fetch, lr)
        end.record()
        end.synchronize()
        steps.append((row["t_iter"], start.elapsed_time(end) / 1e3))
        return row

    Worker.step = timed
    try:
        return {"summary": run_worker(rank, world, cfg, run_dir), "steps": steps}
    finally:
        Worker.step = step


def network(rank: int, world: int, cfg: dict):
    """netbench's ping-pong and its reducers' collectives on this group (NCCL here)."""
    return netbench._run_pingpong(rank, world, cfg), netbench._run_collectives(rank, world, cfg)
