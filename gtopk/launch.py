"""Start P worker processes on this machine, each in a torch.distributed world.

``spawn(fn, nprocs, args)`` runs ``fn(rank, world_size, *args)`` in ``nprocs`` fresh
processes joined in one process group (gloo on loopback by default), and returns the
ranks' return values in rank order. A worker that raises, dies, or outlives ``timeout``
takes the whole group down: the others are terminated after ``grace`` seconds and
``WorkerError`` carries every failed rank's traceback. Process groups are created and
destroyed explicitly in each worker (try/finally).
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class WorkerError(RuntimeError):
    """One or more workers failed; ``failures`` maps rank -> traceback or reason."""

    def __init__(self, failures: dict[int, str]):
        self.failures = failures
        lines = [f"{len(failures)} worker(s) failed:"]
        for rank, text in sorted(failures.items()):
            lines.append(f"--- rank {rank} ---\n{text.rstrip()}")
        super().__init__("\n".join(lines))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads_per_worker(nprocs: int) -> int:
    """Intra-op threads so that nprocs workers never oversubscribe this machine's cores."""
    return max(1, (os.cpu_count() or 1) // nprocs)


def _worker(rank: int, nprocs: int, port: int, backend: str, timeout: float,
            fn: Callable, args: tuple, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(nprocs))
    torch.set_num_threads(threads_per_worker(nprocs))
    try:
        dist.init_process_group(backend, rank=rank, world_size=nprocs,
                                timeout=timedelta(seconds=timeout))
        try:
            out = fn(rank, nprocs, *args)
        finally:
            dist.destroy_process_group()
        # plain pickle: tensors are copied, not shared through fds that die with us
        results.put((rank, True, pickle.dumps(out)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which decides
        results.put((rank, False, traceback.format_exc()))


def spawn(fn: Callable, nprocs: int, args: tuple = (), backend: str = "gloo",
          timeout: float = 120.0, grace: float = 5.0) -> list[Any]:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` processes; return results by rank.

    ``fn`` must be importable (module level). ``timeout`` bounds the whole run and is
    also the process group's collective timeout.
    """
    if nprocs < 1:
        raise ValueError(f"nodes={nprocs} must be >= 1")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(r, nprocs, port, backend, timeout, fn, args, results))
             for r in range(nprocs)]
    for p in procs:
        p.start()
    outputs: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    first_failure: float | None = None
    try:
        while len(outputs) + len(failures) < nprocs:
            now = time.monotonic()
            if now > deadline or (first_failure is not None and now > first_failure + grace):
                break
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except queue.Empty:
                for r, p in enumerate(procs):  # died without reporting (SIGKILL, segfault)
                    if not p.is_alive() and r not in outputs and r not in failures and p.exitcode != 0:
                        failures[r] = f"process exited with code {p.exitcode} before reporting"
                        first_failure = first_failure or time.monotonic()
                continue
            if ok:
                outputs[rank] = pickle.loads(payload)
            else:
                failures[rank] = payload
                first_failure = first_failure or time.monotonic()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    missing = [r for r in range(nprocs) if r not in outputs and r not in failures]
    for r in missing:
        failures[r] = ("stopped: another rank failed first" if failures
                       else f"no result within timeout={timeout}s (hung?)")
    if failures:
        raise WorkerError(failures)
    return [outputs[r] for r in range(nprocs)]
