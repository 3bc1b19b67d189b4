"""Worker functions for the dilated-cluster tests (module level: spawned processes import them)."""

from __future__ import annotations

import os

import torch.distributed as dist

from gtopk import host


def where_and_when(rank: int, P: int) -> dict:
    """Each rank's cgroups (``/proc/self/cgroup``) and time dilation, as its worker sees them."""
    dist.barrier()
    with open("/proc/self/cgroup") as f:
        cgroup = f.read()
    return {"cgroup": cgroup, "dilation": host.dilation(), "env": os.environ.get(host.DILATION_ENV)}
