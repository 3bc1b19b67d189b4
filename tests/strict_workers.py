"""Worker functions that run our distributed code under the strict NCCL stand-in
(``tests.strict_nccl``), in a ``gtopk.run.pool.WorkerGroup`` (module level: spawned
processes import them). Each rank leaves the group's gloo world and joins again through
``gtopk.run.world.join_group("nccl", ...)`` on a faked GPU host, the way a GPU job starts,
then runs one task with ``ExplicitDevice`` active inside every step."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from gtopk.perf import netbench
from gtopk.run.world import join_group
from gtopk.simulated.ranks import run_simulated
from gtopk.simulated.worker import SimulatedWorker
from gtopk.train.loop import run_worker
from gtopk.train.worker import Worker
from tests.strict_nccl import ExplicitDevice, _Patches, strict


@contextlib.contextmanager
def explicit_inside(*methods: tuple[type, str]) -> Iterator[None]:
    """``ExplicitDevice`` active inside each ``(class, method)`` while this lasts."""
    patches = _Patches()

    def wrap(fn: Callable) -> Callable:
        def inside(*args: Any, **kwargs: Any) -> Any:
            with ExplicitDevice():
                return fn(*args, **kwargs)

        return inside

    for cls, name in methods:
        patches.set(cls, name, wrap(getattr(cls, name)))
    try:
        yield
    finally:
        patches.undo()


def job(rank: int, world: int, cfg: dict, run_dir: str) -> Any:
    """One training-loop job (``run_worker``), every step explicit about devices."""
    with explicit_inside((Worker, "step")):
        return run_worker(rank, world, cfg, run_dir)


def simulated(rank: int, world: int, cfg: dict, run_dir: str) -> Any:
    """A simulated job (P virtual ranks in rank 0's process; not collective)."""
    if rank:
        return None
    with explicit_inside((SimulatedWorker, "step")):
        return run_simulated(0, 1, cfg, run_dir)


def network(rank: int, world: int, cfg: dict) -> Any:
    """netbench's ping-pong and its every reducer's collective, explicit throughout."""
    with ExplicitDevice():
        return netbench._run_pingpong(rank, world, cfg), netbench._run_collectives(rank, world, cfg)


TASKS = {"job": job, "simulated": simulated, "network": network}


def as_nccl(rank: int, world: int, store: str, task: str, args: tuple) -> dict:
    """Collective: rejoin as NCCL on a faked ``world``-GPU host (local rank = rank), run
    ``TASKS[task](rank, world, *args)`` under NCCL's rules; returns its result and the
    ``torch.distributed`` calls that went through the checks."""
    dist.destroy_process_group()  # the group's own gloo world
    os.environ["LOCAL_RANK"] = str(rank)
    try:
        with strict("cpu", gpus=world) as rules:
            join_group("nccl", 120, 120, store=dist.FileStore(store, world), rank=rank, world_size=world)
            out = TASKS[task](rank, world, *args)
        return {"out": out, "calls": dict(rules.counts)}
    finally:
        del os.environ["LOCAL_RANK"]
