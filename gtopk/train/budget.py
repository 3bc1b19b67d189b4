"""How many timed steps a benchmark runs: ``benchmark.iters``, or fewer where a step is long.

With ``benchmark.budget_s`` set, the first timed step sets the count: as many steps as fit
in ``budget_s`` at that step's pace on the slowest rank, at least ``benchmark.min_iters``
and at most ``benchmark.iters``. A sweep then spends about the same time on every job: a
0.1 s step is timed ``iters`` times, a 6 s one (AlexNet's dense all-reduce at P = 8 on
1 Gbit/s) once. Every timed step counts in the summary, the first included.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist


def steps_in_budget(t_first: float, iters: int, budget_s: float | None, min_iters: int = 1) -> int:
    """Local. Timed steps for a job whose first timed step took ``t_first`` seconds (on the
    slowest rank): ``iters`` without a budget, else floor(budget_s / t_first) clamped to
    [min(min_iters, iters), iters]."""
    if budget_s is None:
        return iters
    fit = math.floor(budget_s / t_first) if t_first > 0 else iters
    return max(min(min_iters, iters), min(iters, fit))


def timed_steps(t_first: float, bench: Any, device: torch.device) -> int:
    """Collective when ``bench.budget_s`` is set (one all_reduce, MAX of the ranks' first
    timed step, so every rank runs the same count); otherwise local: ``bench.iters``."""
    budget = bench.get("budget_s")
    if budget is None:
        return int(bench.iters)
    slowest = torch.tensor([float(t_first)], dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return steps_in_budget(slowest.item(), int(bench.iters), float(budget), int(bench.get("min_iters", 1)))
