"""torch DistributedDataParallel as a reducer: the strongest dense baseline.

DDP all-reduces gradients in buckets while backward runs (overlap), so by the time the
loop calls ``reduce`` the gradient is already averaged: ``reduce`` returns it unchanged.
Select with ``reducer=ddp``.

Its communication is timed by a DDP communication hook (``TimedAllReduce``): DDP's own
all-reduce of each bucket (the same collective, a bit-identical averaged gradient) with a
stamp when the bucket becomes ready and one when its all-reduce completes. The gradient
computation is over when the last bucket is ready; what backward spends after that is
communication it could not hide, and the training loop reports it as t_commu (the rest
of backward stays t_compute). The whole all-reduce window, hidden or not, is recorded as
``t_commu_backward``.

The hook baselines (``baselines.fp16``, ``baselines.powersgd``) are this reducer with
another communication inside the same timing hook: torch's own hooks, called as they are
(``communicate``). The hook also notes the elements each bucket's all-reduces carried, from
which the record reports what the step sent (``payload_bytes``, and ring traffic).
With ``cluster=simulated`` the hook baselines run the same ``communicate`` for P virtual
ranks of one process, on DDP's buckets (``prepare_group``, ``reduce_group``:
``gtopk.simulated.hooks``); plain DDP is refused there (``reducer=dense`` is its update).
"""

# no ``from __future__ import annotations``: DDP checks the hook's annotations as objects
import math
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from gtopk.host import Clock
from gtopk.reducers.backward import Backward, BackwardCommu
from gtopk.reducers.costmodel import (
    VALUE_BYTES,
    Network,
    ddp_bucket_indices,
    ddp_buckets,
    dense_time,
    dense_traffic,
    overlapped_time,
    ready_offsets,
    ring_time,
)
from gtopk.reducers.dense import DenseReducer, bucket_numel, bucket_sizes
from gtopk.reducers.outcome import ReduceRecord
from gtopk.simulated.hooks import HookGroup, hook_group

Stamp = float | torch.cuda.Event
#: (state, bucket) -> (future of the bucket's averaged gradient, elements of each all-reduce issued)
Communicate = Callable[[object, dist.GradBucket], tuple[torch.futures.Future[Tensor], list[int]]]


class TimedAllReduce(Backward):
    """DDP communication hook and the backward passes that run it (collective: each
    bucket's ``all_reduce``, issued by DDP from backward on every rank).

    Stamps: on CPU, ``gtopk.host.Clock`` readings (``time.perf_counter``) taken in the
    autograd thread when a bucket is ready, in the process group's thread when its
    all-reduce completes (the future's ``then`` callback), and after ``loss.backward()``
    returns. On CUDA, timing events recorded at those points on the current streams, so
    nothing waits for the GPU: the bucket-ready event completes when the kernels that
    filled the bucket have; the completion event is recorded in the ``then`` callback, on
    the stream torch synchronises with the NCCL kernels, so it completes when the
    all-reduce has; the end event follows DDP's copy of the results into ``.grad``.
    Durations are read from the events in ``take``, after the loop's syncing clock.
    """

    def __init__(self, device: torch.device, communicate: Communicate | None = None):
        self.cuda = device.type == "cuda"
        self.communicate = communicate or mean_allreduce
        self._sent: list[int] = []  # elements of every all-reduce since the last take_sent
        self.clock = Clock(torch.device("cpu"))  # never waits: CUDA work is stamped with events
        self._ready: list[Stamp] = []
        self._done: list[Stamp] = []
        self._passes: list[tuple[list[Stamp], list[Stamp], Stamp]] = []

    def _stamp(self) -> Stamp:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.clock()

    @staticmethod
    def _seconds(a: Stamp, b: Stamp) -> float:
        if isinstance(a, torch.cuda.Event):
            return a.elapsed_time(b) / 1e3
        return b - a

    def hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
        """Called by DDP when ``bucket`` is ready: ``communicate(state, bucket)`` (DDP's own
        mean all-reduce unless given another), stamped at its start and completion."""
        self._ready.append(self._stamp())
        fut, sent = self.communicate(state, bucket)
        self._sent.extend(sent)

        def completed(f: torch.futures.Future) -> Tensor:
            self._done.append(self._stamp())
            value = f.value()
            return value[0] if isinstance(value, list) else value

        return fut.then(completed)

    def take_sent(self) -> list[int]:
        """Elements of each all-reduce the hook issued since the last call (then forgotten)."""
        sent, self._sent = self._sent, []
        return sent

    def run(self, loss: Tensor) -> None:
        """Collective (DDP's all-reduces). One backward pass; DDP returns from it once every
        bucket's all-reduce has completed and been copied into ``.grad``."""
        self._ready, self._done = [], []
        loss.backward()
        if self._ready:
            self._passes.append((self._ready, self._done, self._stamp()))
        self._ready, self._done = [], []

    def take(self) -> BackwardCommu:
        out = BackwardCommu()
        for ready, done, end in self._passes:
            out.exposed += max(0.0, self._seconds(ready[-1], end))
            out.total += max(self._seconds(ready[0], d) for d in done) if done else 0.0
        self._passes = []
        return out


def mean_allreduce(group: dist.ProcessGroup | None, bucket: dist.GradBucket):
    """Collective. DDP's own averaging, as a hook: the bucket is scaled by 1/P and summed,
    as DDP does without a hook (torch's ``allreduce_hook`` divides by P instead, which
    differs in the last bit when P is not a power of two), so the averaged gradient is
    bit-identical."""
    buffer = bucket.buffer()
    buffer.mul_(1.0 / dist.get_world_size(group))
    return dist.all_reduce(buffer, group=group, async_op=True).get_future(), [buffer.numel()]


class DDPReducer(DenseReducer):
    """Collective work happens in DDP's backward hooks (``all_reduce`` per bucket). The
    record reports what those all-reduces carried (``payload_bytes``) and their nominal
    ring traffic (``gtopk.reducers.costmodel.dense_traffic``) over the buckets DDP built."""

    #: bytes per element on the wire (the fp16 hook: 2)
    word: int = VALUE_BYTES

    display_name = "DDP"
    plot_order = 20
    #: the update is dense's (``exact_average`` and ``reference`` come from DenseReducer)
    payoff_baseline = True
    #: communicates inside backward: ``predict_body`` models what backward hides
    overlaps_backward = True
    #: DDP all-reduces from backward hooks across real processes (cluster=simulated: reducer=dense)
    simulatable = False
    #: set by ``wrap`` (P > 1): the backward passes that run and time DDP's all-reduces
    hooked_backward: TimedAllReduce | None = None
    #: whether the hook computes more than it sends (PowerSGD's compression): with one worker,
    #: where no hook runs, ``time_hook_alone`` times it anyway (t_compr) for the model to add at P
    hook_arithmetic = False
    #: set by ``time_hook_alone``: a twin of this reducer on a one-rank in-process group
    alone: "DDPReducer | None" = None

    @classmethod
    def bucket_commu(cls, P: int, bucket: list[tuple[int, ...]], net: Network, **settings) -> float:
        """Alpha-beta time of one bucket's communication (its parameters' shapes): here the
        ring all-reduce of its elements, ``word`` bytes each."""
        return ring_time(P, sum(math.prod(s) for s in bucket), net, word=cls.word)

    @classmethod
    def predict_commu(cls, P: int, m: int, net: Network, shapes=None, bucket_mb: float = 25.0, **settings) -> float:
        """``bucket_commu`` over DDP's buckets of the parameters ``shapes``, one after
        another; without shapes, ring all-reduces of ``bucket_mb`` slices of the m entries."""
        if shapes is None:
            return dense_time(P, bucket_sizes(m, bucket_numel(bucket_mb)), net, word=cls.word)
        return sum(cls.bucket_commu(P, b, net, **settings) for b in ddp_buckets(shapes, bucket_mb))

    @classmethod
    def predict_body(
        cls, P: int, m: int, net: Network, t_compute: float, shapes=None, bucket_mb: float = 25.0, **settings
    ) -> float:
        """Forward/backward and communication as the replayed backward runs them
        (``gtopk.train.replay_backward``): each of DDP's buckets starts its communication
        once its last gradient is ready (``ready_offsets``) and the bucket before it is done;
        the step's body ends when backward and the last bucket have. Without ``shapes``
        nothing is hidden (t_compute plus ``predict_commu``)."""
        if shapes is None:
            return t_compute + cls.predict_commu(P, m, net, bucket_mb=bucket_mb, **settings)
        ready = ready_offsets([len(s) for s in shapes], t_compute)
        buckets = ddp_bucket_indices(shapes, bucket_mb)
        times = [cls.bucket_commu(P, [tuple(shapes[i]) for i in b], net, **settings) for b in buckets]
        return max(t_compute, overlapped_time([max(ready[i] for i in b) for b in buckets], times))

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world_size == 1:
            return model
        with warnings.catch_warnings():  # broadcast_buffers' deprecation notice; we want no syncing
            warnings.simplefilter("ignore", FutureWarning)
            # BN statistics stay per rank, as in the paper (buffers were broadcast at start)
            # init_sync=False: the training loop has made the weights identical on every rank
            # (gtopk.train.state.broadcast_and_check); DDP's own broadcast would repeat it
            # (10 s for AlexNet at P = 8 on the emulated 1 Gbit/s network)
            ddp = DistributedDataParallel(
                model, bucket_cap_mb=self.bucket_mb, process_group=self.group, broadcast_buffers=False, init_sync=False
            )
        self.hooked_backward = TimedAllReduce(next(model.parameters()).device, self.communicate)
        ddp.register_comm_hook(self.hook_state(self.group, model), self.hooked_backward.hook)  # hook(state, bucket)
        return ddp

    def hook_state(self, group: dist.ProcessGroup | None, model: nn.Module) -> object:
        """The state DDP passes to the hook for ``model`` (here: the process group)."""
        return group

    def communicate(self, state: object, bucket: dist.GradBucket):
        """Collective. One bucket's communication (see ``Communicate``)."""
        return mean_allreduce(state, bucket)

    def _sent(self) -> list[int]:
        """Elements of the all-reduces the hook issued since the last step (P = 1: none)."""
        return self.hooked_backward.take_sent() if self.hooked_backward else []

    def twin(self) -> "DDPReducer":
        """A new reducer of this class with these settings and no state."""
        return type(self)(bucket_mb=self.bucket_mb)

    def time_hook_alone(self, model: nn.Module, input_shape: tuple[int, ...] | None) -> None:
        """Local. With one worker DDP is not used and no hook runs (``wrap``). A reducer whose
        hook computes (``hook_arithmetic``) times it anyway: a ``twin`` on a one-rank
        in-process group (``gtopk.simulated.hooks``, DDP's buckets for inputs of
        ``input_shape``) runs the hook on each step's gradient, its result discarded, and the
        time is the step's ``t_compr`` (as torch's DDP, which runs its hook with one rank
        too); a job at P > 1 has it inside ``t_commu_backward``. The twin is not
        checkpointed: a resumed job's starts again. Elsewhere: nothing."""
        if self.world_size != 1 or not self.hook_arithmetic:
            return
        twin, shared = self.twin(), HookGroup(1, model, input_shape, self.bucket_mb)
        twin.simulation, twin.comm_state = shared, twin.hook_state(shared.group(0), model)
        self.alone = twin

    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock, out: Tensor | None = None) -> Tensor:
        if self.alone is not None:  # one worker: the hook's arithmetic, timed (``time_hook_alone``)
            t0 = clock()
            hook_group([self.alone], [grad])  # its buckets are copies: grad is not touched
            rec.t_compr = clock() - t0
        self.record(rec, [n for n in self._sent() if n], grad.numel(), self.world_size)
        return grad if out is None or out is grad else out.copy_(grad)

    def record(self, rec: ReduceRecord, sent: list[int], m: int, P: int) -> None:
        """Local. A step's record from the elements of its all-reduces (``sent``, none
        empty) on P ranks, m gradient entries: what they carried and their ring traffic."""
        rec.selected = m
        rec.payload_bytes = sum(sent) * self.word
        rec.set_traffic(dense_traffic(P, sent, self.word))

    # -- cluster=simulated: the hooks of P virtual ranks in one process (gtopk.simulated.hooks) --
    #: the in-process group this reducer is a rank of (set by ``prepare_group``; None: P = 1)
    simulation: HookGroup | None = None
    #: what ``communicate`` gets as its state there (``hook_state`` for the rank's group)
    comm_state: object = None

    @classmethod
    def prepare_group(cls, workers: list, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        """Local. Make ``workers[i]`` rank i of an in-process group of P = len(workers) for
        ``model`` (inputs of ``input_shape``): DDP's bucket layouts, each rank's hook state.
        With one worker there is no hook (as ``wrap``). Call once, before ``load_state_dict``."""
        if len(workers) == 1:
            return
        shared = HookGroup(len(workers), model, input_shape, workers[0].bucket_mb)
        for rank, w in enumerate(workers):
            w.simulation = shared
            w.comm_state = w.hook_state(shared.group(rank), model)

    @classmethod
    def reduce_group(cls, workers, grads, accumulated=False):
        """Local: ``gtopk.simulated.hooks.hook_group`` (after ``prepare_group``)."""
        if accumulated:
            raise ValueError("the hook baselines keep no residual rows: their gradients cannot have been accumulated")
        return hook_group(workers, grads)
