"""Worker functions for the emulated-cluster tests (module level: spawned processes import
them)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def where_am_i(rank: int, P: int) -> dict:
    """Each rank's view: its eth0 address and the rendezvous settings it got."""
    addrs = open("/proc/net/fib_trie").read()
    dist.barrier()
    return {
        "master": os.environ["MASTER_ADDR"],
        "ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "sees_own_address": f"10.99.0.{rank + 1}" in addrs,
    }


def one_way_seconds(rank: int, P: int, nbytes: int, reps: int) -> float | None:
    """Rank 0 sends ``nbytes`` to rank 1 ``reps`` times; the fastest one-way time."""
    buf = torch.zeros(nbytes, dtype=torch.uint8)
    best = float("inf")
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf[:1], 1)  # 1-byte acknowledgement: the data has arrived
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf[:1], 0)
        best = min(best, time.perf_counter() - t0)
    return best if rank == 0 else None
