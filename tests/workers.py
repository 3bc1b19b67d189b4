"""Worker functions run by gtopk.run.spawn.spawn in the distributed tests (module level, so
that spawned processes can import them). Each returns plain data for the parent to check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gtopk.reducers import DenseReducer, GTopKReducer, TopKReducer, reference
from gtopk.reducers.selection.exact import k_for


@dataclass(frozen=True)
class Case:
    """One reducer configuration checked against the reference for a few iterations."""

    kind: str  # "dense" | "topk" | "gtopk"
    m: int
    density: float = 1.0
    data: str = "normal"  # "normal" or "ties" (small integers: many equal magnitudes)
    options: dict = field(default_factory=dict)
    iters: int = 3
    seed: int = 0
    inplace: bool = False  # reduce(grad, out=grad): the update overwrites the gradient (the training loop's call)

    @property
    def name(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.kind}[m={self.m},d={self.density},{self.data},{opts}{',inplace' if self.inplace else ''}]"


REDUCERS = {"dense": DenseReducer, "topk": TopKReducer, "gtopk": GTopKReducer}


def build(case: Case):
    kwargs = dict(case.options)
    if case.kind != "dense":
        kwargs["density"] = case.density
    return REDUCERS[case.kind](**kwargs)


def make_grads(case: Case, it: int, P: int) -> list[torch.Tensor]:
    """Every rank's gradient at iteration ``it`` (identical on all ranks: seeded)."""
    g = torch.Generator().manual_seed(1000 * case.seed + it)
    if case.data == "ties":
        return [torch.randint(-3, 4, (case.m,), generator=g).float() for _ in range(P)]
    return [torch.randn(case.m, generator=g) for _ in range(P)]


def reference_step(case: Case, accs: list[torch.Tensor], P: int):
    k = k_for(case.density, case.m)
    options = {n: v for n, v in case.options.items() if n not in ("align_timing", "transport")}  # timing only
    if case.kind == "dense":
        return reference.dense(accs)
    if case.kind == "topk":
        return reference.topk(accs, k, **options)
    return reference.gtopk(accs, k, **options)


def check_against_reference(rank: int, P: int, cases: list[Case]) -> dict:
    """Run every case; compare update and residual with the reference at every iteration.

    Sparse reducers must match exactly; dense to float rounding of the all-reduce. For
    every iteration it also gathers all ranks' acc and residual and checks conservation
    (exact put-back) and returns the records and last updates for the parent to compare.
    """
    failures, records, last_updates, mass_errors = [], {}, {}, {}
    for case in cases:
        reducer = build(case)
        ref_res = [torch.zeros(case.m) for _ in range(P)]
        worst = 0.0
        for it in range(case.iters):
            grads = make_grads(case, it, P)
            accs = [r + g for r, g in zip(ref_res, grads)]
            ref_update, ref_res = reference_step(case, accs, P)
            grad = grads[rank].clone() if case.inplace else grads[rank]
            update, rec = reducer.reduce(grad, out=grad if case.inplace else None)
            if case.inplace and update is not grad:
                failures.append(f"{case.name} P={P} rank={rank} iter={it}: the update is not the out= tensor")
            residual = getattr(reducer, "feedback", None)
            residual = residual.residual if residual is not None else torch.zeros(case.m)
            if case.kind == "dense":
                ok = torch.allclose(update, ref_update, rtol=1e-5, atol=1e-6)
            else:
                ok = torch.equal(update, ref_update) and torch.equal(residual, ref_res[rank])
            if not ok:
                diff = (update - ref_update).abs().max().item()
                failures.append(f"{case.name} P={P} rank={rank} iter={it}: max |update diff|={diff}")
                break
            start, end = reducer.commu_span
            if not (start <= end and abs((end - start) - rec.t_commu) < 1e-9):
                failures.append(
                    f"{case.name} P={P} rank={rank} iter={it}: commu_span {reducer.commu_span} "
                    f"does not span t_commu={rec.t_commu}"
                )
            # conservation, on the distributed reducer's own state
            mine = torch.stack([accs[rank], residual])
            both = [torch.empty_like(mine) for _ in range(P)]
            dist.all_gather(both, mine)
            sum_acc = sum(b[0] for b in both)
            sum_res = sum(b[1] for b in both)
            err = (sum_acc - (P * update + sum_res)).abs().max().item()
            worst = max(worst, err / max(1.0, sum_acc.abs().max().item()))
        records[case.name] = rec.as_dict()
        last_updates[case.name] = update
        mass_errors[case.name] = worst
    return {"failures": failures, "records": records, "updates": last_updates, "mass": mass_errors}


def bad_gradient(rank: int, P: int, kind: str, mode: str) -> str:
    """Rank 1 passes a bad gradient; every rank returns the error it raised."""
    m = 100
    grad = torch.randn(m)
    if rank == 1:
        grad = torch.randn(m + 1) if mode == "size" else torch.arange(m)
    reducer = build(Case(kind, m, density=0.1))
    try:
        reducer.reduce(grad)
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def run_hand_cases(rank: int, P: int, configs: list[tuple[str, dict]], accs: list[torch.Tensor], k: int):
    """One step per (kind, options) on hand-built accumulated vectors (zero residual)."""
    out = []
    for kind, options in configs:
        reducer = build(Case(kind, accs[0].numel(), density=k / accs[0].numel(), options=options))
        update, _ = reducer.reduce(accs[rank].clone())
        out.append((update, reducer.feedback.residual))
    return out


def fail_on_rank1(rank: int, P: int, how: str) -> None:
    """Rank 1 raises or SIGKILLs itself; the others wait in a collective forever."""
    import os
    import signal

    if rank == 1:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("injected failure on rank 1")
    dist.barrier()
    dist.barrier()


def sleep_forever(rank: int, P: int, pid_dir: str | None = None) -> None:
    """Every rank writes its pid to ``pid_dir`` (if given), then sleeps outside any
    collective and never calls heartbeat(): only the watchdog or a signal ends it."""
    import os
    import time
    from pathlib import Path

    if pid_dir:
        (Path(pid_dir) / f"rank{rank}.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(3600)


def pid_and_threads(rank: int, P: int, tag: str = "") -> dict:
    """This worker's pid, intra-op thread count and the group's size (a collective: every
    rank's pid reaches every rank)."""
    import os

    pids: list = [None] * P
    dist.all_gather_object(pids, os.getpid())
    return {"rank": rank, "pid": os.getpid(), "threads": torch.get_num_threads(), "pids": pids, "tag": tag}


def waits_for_a_stack_request(stack_path: str, ready_path: str) -> None:
    """Registers faulthandler's SIGUSR1 dump into ``stack_path`` as a worker does, says so in
    ``ready_path``, then sleeps until killed."""
    import faulthandler
    import signal
    import time
    from pathlib import Path

    out = open(stack_path, "w")
    faulthandler.register(signal.SIGUSR1, out)
    Path(ready_path).write_text("ready")
    while True:
        time.sleep(3600)
