"""``cluster=simulated``: a training job's P workers as virtual ranks of one process.

The job starts ONE worker process (through the same runner, watchdog and records as P
real ranks) with the intra-op thread count a real rank of the job would get, and that
process trains all P ranks (``gtopk.simulated.ranks.run_simulated``: the one training loop,
``gtopk.train.loop``, over P virtual ranks). There is no network, so only
``mode=train`` runs here; benchmarks (and ``gtopk.perf.netbench``) are refused before
anything starts, as are reducers that need real processes (DDP; its hook baselines
``ddp_fp16`` and ``powersgd`` run here, torch's hooks on P virtual ranks: ``gtopk.simulated.hooks``).

``batched`` (``auto`` | true | false): compute the P gradients in one vectorised pass per
``chunk`` ranks (``gtopk.simulated.batched``) or one after another (false: the exact mode,
bit-identical to ``cluster=local``); ``auto`` batches where that is faster
(``gtopk.simulated.batched.use_batched``). ``chunk``: ranks per pass (null: all P at once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hydra.utils import get_class, instantiate

from gtopk.run.cluster.base import Cluster, ClusterError, Placement

#: bytes per model parameter per virtual rank: its residual and its flat gradient (fp32)
BYTES_PER_PARAM_PER_RANK = 8


class SimulatedCluster(Cluster):
    """P virtual workers in one process (``mode=train`` only)."""

    kind = "simulated"

    def __init__(self, batched: str | bool = "auto", chunk: int | None = 64):
        self.batched, self.chunk = batched, chunk

    def check(self, nodes: int, threads: int | None = None, device: str = "cpu") -> None:
        """Called where a real network is needed (the network benchmark): there is none."""
        raise ClusterError(
            "cluster=simulated has no network to benchmark (its workers share one process); "
            "use cluster=local or cluster=emulated"
        )

    def check_job(self, cfg: Any) -> None:
        """A training job with a reducer that runs in one process, whose P ranks' state fits
        in memory (a lower bound, as ``gtopk.run.checks.machine_fits``)."""
        if cfg.mode != "train":
            raise ClusterError(
                f"mode={cfg.mode} with cluster=simulated: the simulated workers share one process and "
                "have no network to time; use cluster=local or cluster=emulated to benchmark, or mode=train"
            )
        reducer = get_class(cfg.reducer._target_)
        if not reducer.simulatable:
            raise ClusterError(
                f"reducer={cfg.reducer_name} cannot run with cluster=simulated (it communicates between "
                "real processes); use reducer=dense (the same update), topk or gtopk, or cluster=local"
            )
        if getattr(reducer, "overlaps_backward", False) and cfg.grad_accum != 1:
            raise ClusterError(
                f"reducer={cfg.reducer_name} with grad_accum={cfg.grad_accum} and cluster=simulated: DDP runs its hook "
                "after every micro-batch's backward pass, the simulation once per step; use grad_accum=1 "
                "(model.grad_accum.train=1) or cluster=local"
            )
        self.check_batching(cfg)
        from gtopk.run.checks import count_params, memory_total

        need = cfg.nodes * BYTES_PER_PARAM_PER_RANK * count_params(cfg)
        total = memory_total()
        if total and need > total:
            raise ClusterError(
                f"nodes={cfg.nodes} simulated workers need at least {need / 2**30:.1f} GiB for their residuals and "
                f"gradients ({cfg.model_name}), more than this machine's {total / 2**30:.1f} GiB; use fewer nodes"
            )

    def processes(self, nodes: int) -> int:
        return 1

    def entry(self) -> Callable:
        from gtopk.simulated.ranks import run_simulated

        return run_simulated

    @contextmanager
    def up(self, nodes: int) -> Iterator[Placement]:
        yield Placement(master_addr="127.0.0.1", master_port=0)  # the one process's own group

    def check_batching(self, cfg: Any) -> None:
        """``batched`` and ``chunk`` are settings this cluster knows, and a model whose
        forward pass draws random numbers is not batched (its ranks' streams would change)."""
        if self.batched not in ("auto", True, False):
            raise ClusterError(f"cluster.batched={self.batched!r} is unknown; choose one of auto, true, false")
        if self.chunk is not None and (
            isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1
        ):
            raise ClusterError(
                f"cluster.chunk={self.chunk!r} must be an integer >= 1 (ranks per batched pass) or null (all at once)"
            )
        if self.batched is True:
            import torch

            from gtopk.simulated.batched import has_randomness

            with torch.device("meta"):
                net = instantiate(cfg.model.net)
            if has_randomness(net):
                raise ClusterError(
                    f"cluster.batched=true with model={cfg.model_name}: its dropout would draw from one stream "
                    "for all ranks; use cluster.batched=false (or auto)"
                )
