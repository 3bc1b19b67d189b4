"""``cluster=simulated``: a training job's P workers as virtual ranks of one process.

The job starts ONE worker process (through the same runner, watchdog and records as P
real ranks) with the intra-op thread count a real rank of the job would get, and that
process trains all P ranks (``gtopk.train.simulated``). There is no network, so only
``mode=train`` runs here; benchmarks (and ``gtopk.perf.netbench``) are refused before
anything starts, as are reducers that need real processes (DDP).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hydra.utils import get_class

from gtopk.run.cluster.base import Cluster, ClusterError, Placement

#: bytes per model parameter per virtual rank: its residual and its flat gradient (fp32)
BYTES_PER_PARAM_PER_RANK = 8


class SimulatedCluster(Cluster):
    """P virtual workers in one process (``mode=train`` only)."""

    kind = "simulated"

    def check(self, nodes: int) -> None:
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
        if not get_class(cfg.reducer._target_).simulatable:
            raise ClusterError(
                f"reducer={cfg.reducer_name} cannot run with cluster=simulated (it communicates between "
                "real processes); use reducer=dense (the same update), topk or gtopk, or cluster=local"
            )
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
        from gtopk.train.simulated import run_simulated

        return run_simulated

    @contextmanager
    def up(self, nodes: int) -> Iterator[Placement]:
        yield Placement(master_addr="127.0.0.1", master_port=0)  # the one process's own group
