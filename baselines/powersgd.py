"""DDP with torch's PowerSGD hook: the low-rank compression baseline (``reducer=powersgd``).

Each bucket's gradients, viewed as matrices, are approximated at rank r by torch's
``powerSGD_hook`` (``PowerSGDState``), called as it is inside ``baselines.ddp``'s timing
hook: the tensors its compression-rate rule leaves alone are all-reduced as they are, then
the Ps and the Qs, one all-reduce after the other. Settings (validated before any process
starts; defaults in ``conf/reducer/powersgd.yaml``, reasons in docs/reducers.md):

* ``matrix_approximation_rank`` (r, default 2: Vogels et al.'s ResNet-18/CIFAR-10 setting);
* ``start_powerSGD_iter`` (default 2, torch's earliest with error feedback or warm start:
  DDP rebuilds its buckets after the first pass). Backward passes before it run plain
  all-reduces; in ``mode=benchmark`` it may not exceed ``benchmark.warmup``, so that every
  timed step is compressed (torch's own default, 1000, would time plain all-reduces);
* ``use_error_feedback``, ``warm_start`` (default on, as torch), ``min_compression_rate``
  (default 2, as torch), ``random_seed``.

Records: ``payload_bytes`` is 4 bytes times the elements the hook's own compression
statistics (``PowerSGDState.compression_stats``) count as sent that step, so a run proves
compression was on; ``selected`` is that element count.

State across steps (error buffers, P and Q memories, the iteration, the hook's RNG, the
statistics) is this reducer's ``state_dict``: cut per parameter (``baselines.powersgd_state``)
so that a resumed job, whose new DDP has other buckets, continues as the uninterrupted one
would. torch's own pickling of ``PowerSGDState`` drops the process group and restores the
default one (pytorch#75666): it is not used; the state object keeps this reducer's group.
With ``cluster=simulated`` each virtual rank's reducer holds its own state, in the same
checkpoint format (``gtopk.simulated.hooks``).
"""

# no ``from __future__ import annotations``: DDP checks the hook's annotations as objects
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from baselines import powersgd_state as pieces
from baselines.ddp import DDPReducer
from gtopk.reducers.costmodel import Network, powersgd_allreduces, powersgd_time
from gtopk.reducers.outcome import ReduceRecord


def _int_at_least(name: str, value: Any, low: int, example: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"reducer.{name}={value!r} must be an integer >= {low}, e.g. reducer.{name}={example}")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"reducer.{name}={value!r} must be true or false")
    return value


class PowerSGDReducer(DDPReducer):
    """DDP + ``powerSGD_hook`` (collective: the hook's all-reduces, issued by DDP from backward)."""

    #: cluster=simulated runs torch's hook on P virtual ranks (``gtopk.simulated.hooks``)
    simulatable = True
    display_name = "PowerSGD"
    plot_order = 40
    exact_average = False  # a rank-r approximation
    reference = None
    hook_arithmetic = True  # its compression: timed with one worker too (``time_hook_alone``)

    def __init__(
        self,
        matrix_approximation_rank: int = 2,
        start_powerSGD_iter: int = 2,
        use_error_feedback: bool = True,
        warm_start: bool = True,
        min_compression_rate: float = 2.0,
        random_seed: int = 0,
        bucket_mb: float = 25.0,
        group: dist.ProcessGroup | None = None,
        align_timing: bool = False,
    ):
        rank = _int_at_least("matrix_approximation_rank", matrix_approximation_rank, 1, 2)
        feedback, warm = _flag("use_error_feedback", use_error_feedback), _flag("warm_start", warm_start)
        low = 2 if feedback or warm else 1
        if isinstance(start_powerSGD_iter, int) and start_powerSGD_iter < low:
            raise ValueError(
                f"reducer.start_powerSGD_iter={start_powerSGD_iter} must be >= 2 with error feedback or warm start "
                "(torch's PowerSGD: DDP rebuilds its buckets after the first pass); set reducer.start_powerSGD_iter=2"
            )
        start = _int_at_least("start_powerSGD_iter", start_powerSGD_iter, low, 2)
        if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)):
            raise ValueError(f"reducer.min_compression_rate={min_compression_rate!r} must be a number, e.g. 2")
        seed = _int_at_least("random_seed", random_seed, 0, 0)
        super().__init__(bucket_mb, group, align_timing)
        self.settings = dict(
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start,
            use_error_feedback=feedback,
            warm_start=warm,
            min_compression_rate=float(min_compression_rate),
            random_seed=seed,
        )
        self.state: PowerSGDState | None = None
        self._layouts: dict[int, pieces.Layout] = {}  # per bucket index: the layout its buffers follow
        self._pending: pieces.Pieces | None = None  # buffers cut per parameter, waiting for their bucket
        self._index: dict[int, int] = {}  # id(parameter) -> its index in the model
        # The hook issues a bucket's P and Q all-reduces from the callbacks of the one before.
        # NCCL runs those callbacks at once, in the thread that issued the collective, so
        # every rank issues bucket after bucket in the same order; gloo runs them in its
        # own thread when the collective completes, where they would race with the next
        # bucket's all-reduce from backward and pair different collectives across ranks
        # (gloo aborts). On CPU the next bucket therefore waits for the last one's chain.
        self._chain: torch.futures.Future | None = None

    def twin(self) -> "PowerSGDReducer":
        return type(self)(**self.settings, bucket_mb=self.bucket_mb)

    @classmethod
    def check_job(cls, cfg: Any, backend: str) -> None:
        """Benchmark mode times compressed steps only."""
        start = cfg.reducer.get("start_powerSGD_iter", 2)
        if cfg.mode == "benchmark" and start > cfg.benchmark.warmup:
            raise ValueError(
                f"reducer.start_powerSGD_iter={start} is after benchmark.warmup={cfg.benchmark.warmup}: timed steps "
                f"would run plain all-reduces; set reducer.start_powerSGD_iter<={cfg.benchmark.warmup} "
                f"or benchmark.warmup>={start}"
            )

    def hook_state(self, group: dist.ProcessGroup | None, model: torch.nn.Module) -> PowerSGDState:
        """This rank's ``PowerSGDState`` in ``group`` (kept as ``state``) for ``model``."""
        self._index = {id(p): i for i, p in enumerate(model.parameters())}
        self.state = PowerSGDState(process_group=group, compression_stats_logging_frequency=2**62, **self.settings)
        return self.state

    def _layout(self, bucket: dist.GradBucket) -> pieces.Layout:
        base = bucket.buffer().data_ptr()
        size = bucket.buffer().element_size()
        return tuple(
            (self._index[id(p)], (g.data_ptr() - base) // size, tuple(p.shape))
            for p, g in zip(bucket.parameters(), bucket.gradients())
        )

    def communicate(self, state: PowerSGDState, bucket: dist.GradBucket):
        """Collective. torch's ``powerSGD_hook`` on one bucket, after installing the
        bucket's buffers when DDP's bucket layout changed; returns the elements each
        all-reduce carried (checked against the hook's own statistics)."""
        index, layout = bucket.index(), self._layout(bucket)
        rank, rate = self.settings["matrix_approximation_rank"], self.settings["min_compression_rate"]
        if self._layouts.get(index) != layout:
            if self._pending is None:  # DDP rebuilt its buckets: cut what the old layout holds
                self._pending = pieces.cut(state, self._layouts, rank, rate)
                self._layouts = {}
                state.error_dict.clear(), state.p_memory_dict.clear(), state.q_memory_dict.clear()
            pieces.assemble(state, index, layout, bucket.buffer().numel(), self._pending, rank, rate)
            self._layouts[index] = layout
            if not self._pending:
                self._pending = None
        compressing = state.iter >= state.start_powerSGD_iter
        if compressing and self._chain is not None and not self._chain.done():
            self._chain.wait()  # gloo: the last bucket's P and Q all-reduces first (see ``_chain``)
        before = state.total_numel_after_compression
        fut = powerSGD_hook(state, bucket)
        self._chain = fut if bucket.buffer().device.type == "cpu" else None
        if not compressing:
            return fut, [bucket.buffer().numel()]
        sent = powersgd_allreduces([s for _, _, s in layout], rank, rate)
        if sum(sent) != state.total_numel_after_compression - before:
            raise RuntimeError(
                f"PowerSGD sent {state.total_numel_after_compression - before} elements for bucket {index} by torch's "
                f"statistics, {sum(sent)} by gtopk.reducers.costmodel.powersgd_allreduces: the rule has diverged"
            )
        return fut, sent

    def record(self, rec: ReduceRecord, sent: list[int], m: int, P: int) -> None:
        """``DDPReducer.record``; ``selected``: the elements sent (m with one rank)."""
        super().record(rec, sent, m, P)
        rec.selected = rec.payload_bytes // self.word if P > 1 else m

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Local. This rank's PowerSGD state, per parameter (``{}`` with one worker: no hook)."""
        s = self.state
        if s is None:
            return {}
        rank, rate = self.settings["matrix_approximation_rank"], self.settings["min_compression_rate"]
        params = pieces.cut(s, self._layouts, rank, rate)
        for index, piece in (self._pending or {}).items():
            params.setdefault(index, {k: v.clone() for k, v in piece.items()})
        return {
            "powersgd": dict(self.settings),
            "iter": s.iter,
            "totals": (s.total_numel_before_compression, s.total_numel_after_compression),
            "rng": pieces.rng_to_tensors(s.rng),
            "params": params,
        }

    def load_state_dict(self, state: dict) -> None:
        """Local. Restore ``state_dict``'s result into this rank's hook state (after ``wrap``)."""
        if not state:
            return
        if "powersgd" not in state:
            raise ValueError(
                f"PowerSGDReducer was given {sorted(state)}; load a checkpoint written with reducer=powersgd"
            )
        if state["powersgd"] != self.settings:
            raise ValueError(f"the checkpoint's PowerSGD settings {state['powersgd']} differ from {self.settings}")
        s = self.state
        if s is None:
            raise ValueError(
                "PowerSGD state needs the hook: load it after wrap() (cluster=simulated: prepare_group) "
                "with more than one worker"
            )
        s.iter = state["iter"]
        s.total_numel_before_compression, s.total_numel_after_compression = state["totals"]
        pieces.rng_from_tensors(s.rng, state["rng"])
        s.error_dict.clear(), s.p_memory_dict.clear(), s.q_memory_dict.clear()
        self._layouts, self._pending = {}, {i: dict(p) for i, p in state["params"].items()}

    @classmethod
    def bucket_commu(
        cls,
        P: int,
        bucket: list[tuple[int, ...]],
        net: Network,
        matrix_approximation_rank: int = 2,
        min_compression_rate: float = 2.0,
        **_,
    ) -> float:
        """The hook's three ring all-reduces of one bucket, one after the other: the
        uncompressed tensors, the Ps, the Qs (``gtopk.reducers.costmodel.powersgd_time``).
        Each of their 2(P - 1) ring steps costs alpha + max(software, its chunk's bytes x
        beta) (``software_ring_time``): the per-message software cost the network's
        calibration measures (``Network.software``) shows in a step whose wire time is
        shorter, which these all-reduces of a few KB mostly are; DDP's large steps hide it
        (measured: docs/payoff.md). The hook's arithmetic (matrix products,
        orthogonalisation, error feedback, copies) is not here: a P = 1 job times it
        (``time_hook_alone``) as its t_compr, which the model adds to the step."""
        return powersgd_time(P, [bucket], net, matrix_approximation_rank, min_compression_rate)

    @classmethod
    def predict_commu(cls, P: int, m: int, net: Network, shapes=None, **settings) -> float:
        """The hook's all-reduces per DDP bucket; needs the model's parameter ``shapes``."""
        if shapes is None:
            raise ValueError("PowerSGD's communication model needs the model's parameter shapes (shapes=...)")
        return super().predict_commu(P, m, net, shapes=shapes, **settings)
