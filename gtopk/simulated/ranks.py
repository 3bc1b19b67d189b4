"""``cluster=simulated``'s side of the one training loop: P virtual ranks as ``Ranks``.

``run_simulated`` is the entry of the job's single worker process (``gtopk.run.cluster.
SimulatedCluster`` starts it through the same runner as P real ranks, with the intra-op
thread count a real rank would get). It runs ``gtopk.train.loop.run``, the loop real ranks
run: the same schedule (LR warm-up over P, density warm-up, ``max_iters_per_epoch``),
evaluation, checkpoint per epoch and records: ``iters.rank<i>.jsonl`` per virtual rank,
``epochs.jsonl`` (rank 0's training loss, every rank's test shard), ``summary.json`` with
``weights_sha256`` (rank 0's BN statistics, as a distributed job's rank 0 writes it) and
``batched`` (whether the P gradients were computed in one pass: ``gtopk.simulated.batched``).

The result is the distributed run's: in the exact mode (``cluster.batched=false``), for
Top-k and gTop-k the final weights (and every rank's BN statistics, residual and loss) are
bit-identical to ``cluster=local`` with the same seed, P, ``threads_per_worker`` and
``train.loader_workers=0`` (the simulation always loads in-process; with loader processes
a real rank draws its augmentation from their RNG instead); dense agrees to float rounding
(the all-reduce's summation order). ``tests/distributed/test_simulated.py`` checks it for
P = 2, 3, 4. The batched mode agrees to float rounding per step (``tests/unit/test_batched.py``).

Rows (``gtopk.train.rows.step_row``, as a real rank's): t_data, t_compute, t_check,
t_compr, loss and the diagnostics are the rank's own; t_commu is 0 (nothing is sent;
bytes_* and messages_sent are what the rank would send, from the cost model; the hook
baselines' also ``payload_bytes``, from the buckets their hooks all-reduced,
``gtopk.simulated.hooks``); t_update is the step's shared part (aggregation, the hooks
included, and SGD step); t_iter is the whole step, so ``images_per_s_per_worker`` is batch
/ step time and P times it the job's throughput. Not collective: no process group is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from gtopk.host import heartbeat
from gtopk.records.summary import SIMULATED_BACKEND
from gtopk.simulated.worker import SimulatedWorker
from gtopk.train.device import pick_device
from gtopk.train.loop import run
from gtopk.train.memory import reset_peak_rss
from gtopk.train.ranks import Ranks
from gtopk.train.state import restore, snapshot, weights_sha256

BACKEND = SIMULATED_BACKEND  # what records say instead of a torch.distributed backend


def run_simulated(rank: int, world: int, cfg_dict: dict, run_dir: str) -> dict:
    """Entry point of a simulated job's one process (``rank`` 0 of ``world`` 1): trains
    ``cfg.nodes`` virtual ranks (``gtopk.train.loop.run``) and returns the summary. Not
    collective."""
    cfg = OmegaConf.create(cfg_dict)
    device = pick_device(cfg, 0)
    reset_peak_rss()
    return run(SimulatedRanks(SimulatedWorker(int(cfg.nodes), cfg, Path(run_dir), device)))


class SimulatedRanks(Ranks):
    """All ``worker.world`` ranks of a job, the virtual ranks of ``worker`` (this process
    leads). Local: nothing here is collective."""

    def __init__(self, worker: SimulatedWorker):
        self.w = worker
        self.cfg, self.run_dir, self.device = worker.cfg, worker.run_dir, worker.device
        self.world, self.m, self.compute = worker.world, worker.m, worker.compute
        self.hosted = worker.ranks

    def describe(self) -> dict:
        return {
            "backend": BACKEND,
            "threads_per_worker": torch.get_num_threads(),
            "batched": self.w.batched is not None,  # the P gradients in one pass (cluster.batched), not one by one
        }

    def step(self, lr: float) -> list[dict]:
        return self.w.step([s.__next__ for s in self.streams], lr)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Test loss and top-1 over all ranks' test shards, each rank with its own BN
        statistics (``Worker.evaluate``, its all_reduce a sum in rank order here; batched:
        all ranks' j-th test batches in one pass, each rank's loader started under its RNG)."""
        w = self.w
        if w.batched is not None:
            return self._batched_evaluate()
        sums = torch.zeros(3, dtype=torch.float64)
        for vr in w.ranks:
            with w.active(vr):
                w.model.eval()
                for x, y in vr.test_loader:
                    x, y = x.to(w.device), y.to(w.device)
                    out = w.model(x)
                    loss = F.cross_entropy(out, y, reduction="sum").item()
                    sums += torch.tensor([loss, (out.argmax(1) == y).sum().item(), y.numel()], dtype=torch.float64)
                    heartbeat()
                w.model.train()
        return {"test_loss": (sums[0] / sums[2]).item(), "test_top1": (sums[1] / sums[2]).item()}

    def _batched_evaluate(self) -> dict:
        w, streams = self.w, []
        for vr in w.ranks:
            with w.drawing(vr):
                streams.append(iter(vr.test_loader))
        loss = correct = count = 0.0
        for batches in zip(*streams):  # every rank's shard has as many batches, of one size each
            batches = [(x.to(w.device), y.to(w.device)) for x, y in batches]
            sums = w.batched.evaluate(batches)
            loss, correct = loss + sums[0].sum().item(), correct + sums[1].sum().item()
            count += sum(y.numel() for _, y in batches)
            heartbeat()
        return {"test_loss": loss / count, "test_top1": correct / count}

    def save(self, epoch: int, metrics: dict) -> None:
        """Generation ``epoch`` (``Store.save_all``): every rank's file in the distributed
        format (its own BN statistics, residual and RNG state), then the manifest."""
        w = self.w

        def states() -> Iterator[dict]:
            for vr in w.ranks:
                with w.active(vr):
                    state = snapshot(w.model, w.opt, vr.reducer, epoch, metrics, w.device)
                yield state

        w.store.save_all(epoch, states(), self.cfg.get("fingerprint"))

    def load(self) -> tuple[int, dict | None]:
        """Resume from the newest generation intact on every rank (``Store.load_all``; one
        of the finished run this job trains longer too, ``extends``): (next epoch, its
        metrics), or (0, None)."""
        w = self.w
        chosen, states = w.store.load_all(self.cfg.get("fingerprint"), w.device, self.extends)
        if chosen is None:
            return 0, None
        for rank, state in enumerate(states):
            if not all(torch.equal(state["model"][n], states[0]["model"][n]) for n, _ in w.model.named_parameters()):
                raise RuntimeError(
                    f"rank {rank}'s checkpoint of epoch {chosen['epoch']} holds other weights than rank 0's"
                )
        for vr, state in zip(w.ranks, states):
            with w.active(vr):
                restore(w.model, w.opt, vr.reducer, state, w.device)
        return chosen["epoch"] + 1, states[0].get("metrics")

    def finish(self) -> list[dict]:
        """Every virtual rank's rows (one set of parameters for all ranks: nothing to check)."""
        return [row for vr in self.w.ranks for row in vr.records.rows]

    def weights_sha256(self) -> str:
        with self.w.active(self.w.ranks[0]):
            return weights_sha256(self.w.model)
