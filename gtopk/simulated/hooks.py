"""torch's DDP communication hooks for P virtual ranks in one process (``cluster=simulated``).

The hook baselines (``reducer=ddp_fp16``, ``reducer=powersgd``) run torch's own hook
functions here, called as in a DDP job (``DDPReducer.communicate``), on the buckets DDP
would build, once per virtual rank and bucket; their all-reduces pair across the ranks
through an in-process group. Nothing here is collective across processes.

* ``VirtualGroup``: rank i of P, a ``torch.distributed.ProcessGroup`` whose ``allreduce``
  (what ``dist.all_reduce`` calls) hands the tensor to the ``InProcessAllReduce`` that the
  P ranks share. Rank i's n-th all-reduce pairs with every other rank's n-th, as in a
  process group; it completes when the last rank submits it: the sum, in rank order, is
  written into every rank's tensor (in place, as gloo does), and each rank's future is
  completed in a worker thread. torch's PowerSGD hook issues its P and Q all-reduces from
  a future's callback and waits for them there, so each rank's chain of callbacks needs a
  thread of its own while the other ranks catch up (gloo runs them in its own threads too).
* ``ddp_layouts``: DDP's buckets, from torch's own assignment
  (``dist._compute_bucket_assignment_by_size``): a new DDP's first backward pass has one
  bucket of every parameter (in the model's order); DDP then rebuilds them along the order
  in which that pass produced the gradients, read here from one backward pass of the
  model on the meta device (no memory, no arithmetic, no state of the model touched).
* ``HookBucket``: what a hook reads of a ``dist.GradBucket`` (index, flat buffer, views
  of it per parameter, the parameters, whether it is the last).
* ``hook_group``: ``reduce_group`` of the hook reducers: every bucket's P hook calls,
  then the update (rank 0's result: every rank's is the same) and each rank's record.
"""

from __future__ import annotations

import copy
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gtopk.reducers.outcome import ReduceRecord

Layout = list[list[int]]  # per bucket, the indices (into the trainable parameters) of its tensors


class InProcessAllReduce:
    """The sum all-reduces of P virtual ranks (thread-safe; local)."""

    def __init__(self, world: int):
        self.world = world
        self._lock = threading.Lock()
        self._next = [0] * world  # each rank's next all-reduce number
        self._open: dict[int, list[tuple[Tensor, torch.futures.Future] | None]] = {}
        self._error: BaseException | None = None
        # at most one blocked callback chain per rank, plus one thread to complete futures
        self._threads = ThreadPoolExecutor(max_workers=world + 1, thread_name_prefix="virtual-rank")

    def submit(self, rank: int, tensor: Tensor) -> torch.futures.Future:
        """Rank ``rank``'s next all-reduce of ``tensor``: a future of ``[tensor]`` holding the sum."""
        fut: torch.futures.Future = torch.futures.Future()
        with self._lock:
            if self._error is not None:
                raise RuntimeError(f"an in-process all-reduce failed before: {self._error}")
            n = self._next[rank]
            self._next[rank] += 1
            slot = self._open.setdefault(n, [None] * self.world)
            slot[rank] = (tensor, fut)
            complete = all(s is not None for s in slot)
            if complete:
                del self._open[n]
        if complete:
            self._complete(n, slot)  # type: ignore[arg-type]
        return fut

    def _complete(self, n: int, slot: list[tuple[Tensor, torch.futures.Future]]) -> None:
        tensors = [t for t, _ in slot]
        kinds = {(tuple(t.shape), t.dtype, t.device) for t in tensors}
        if len(kinds) > 1:
            self.abort(RuntimeError(f"all-reduce {n} got tensors of different kinds on the virtual ranks: {kinds}"))
            for _, f in slot:
                self._threads.submit(f.set_exception, self._error)
            return
        total = tensors[0].clone()
        for t in tensors[1:]:  # rank order, in the tensors' dtype (fp16: rounded after each add)
            total.add_(t)
        for t, f in slot:
            t.copy_(total)
            self._threads.submit(f.set_result, [t])

    def abort(self, error: BaseException) -> None:
        """Fail every all-reduce still waiting for a rank, and every later one."""
        with self._lock:
            self._error = self._error or error
            waiting = [s[1] for slot in self._open.values() for s in slot if s is not None]
            self._open.clear()
        for f in waiting:
            self._threads.submit(f.set_exception, self._error)

    def wait(self, futures: list[torch.futures.Future]) -> list[Any]:
        """The values of one future per rank (a hook's result); the first error is raised
        after every rank's chain has ended (a failed rank aborts the others' all-reduces)."""

        def watch(f: torch.futures.Future) -> None:
            try:
                f.value()
            except Exception as e:  # noqa: BLE001 - any failure ends the other ranks' waits
                self.abort(e)

        for f in futures:
            f.add_done_callback(watch)
        values, error = [], None
        for f in futures:
            try:
                values.append(f.wait())
            except Exception as e:  # noqa: BLE001 - raised below, once all have ended
                error = error or e
        if error is not None:
            raise error
        return values


class _Work:
    """The handle ``dist.all_reduce(..., async_op=True)`` returns."""

    def __init__(self, fut: torch.futures.Future):
        self._fut = fut

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()


class VirtualGroup(dist.ProcessGroup):
    """Rank ``rank`` of ``reduce.world`` virtual ranks; supports the sum all-reduce only."""

    def __init__(self, rank: int, reduce: InProcessAllReduce):
        super().__init__(rank, reduce.world)
        self._reduce = reduce
        self._rank = rank

    def allreduce(self, tensors: list[Tensor], opts: Any = None) -> _Work:  # what dist.all_reduce calls
        if opts is not None and opts.reduceOp != dist.ReduceOp.SUM:
            raise NotImplementedError(f"the in-process group sums only, not {opts.reduceOp}")
        if len(tensors) != 1:
            raise NotImplementedError("the in-process group all-reduces one tensor at a time")
        return _Work(self._reduce.submit(self._rank, tensors[0]))


def ready_order(model: nn.Module, input_shape: tuple[int, ...]) -> list[int]:
    """Indices (into the trainable parameters) in the order one backward pass of ``model``
    produces their gradients (when DDP's hooks see them ready), from a pass of a copy of
    ``model`` whose parameters and buffers are on the meta device, on two inputs of
    ``input_shape``."""
    tensors = [*model.parameters(), *model.buffers()]
    memo: dict[int, Any] = {id(t): _meta(t) for t in tensors}
    meta = copy.deepcopy(model, memo)  # the modules copied, every tensor replaced by its meta twin
    seen: list[int] = []
    for i, p in enumerate(q for q in meta.parameters() if q.requires_grad):
        p.register_post_accumulate_grad_hook(lambda _, i=i: seen.append(i))
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    meta(torch.empty((2, *input_shape), device="meta", dtype=dtype)).float().sum().backward()
    return seen


def _meta(t: Tensor) -> Tensor:
    twin = torch.empty_like(t, device="meta")
    return nn.Parameter(twin, t.requires_grad) if isinstance(t, nn.Parameter) else twin


def ddp_layouts(model: nn.Module, input_shape: tuple[int, ...] | None, bucket_mb: float) -> tuple[Layout, Layout]:
    """(first, rebuilt): DDP's buckets in its first backward pass and after it rebuilds
    them (``bucket_cap_mb=bucket_mb``, which also caps the first bucket), for the model's
    trainable parameters. Without an ``input_shape`` the rebuilt buckets follow the reverse
    of the model's order (DDP's own guess before a pass)."""
    params = [p for p in model.parameters() if p.requires_grad]
    first, _ = dist._compute_bucket_assignment_by_size(params, [sys.maxsize], [False] * len(params))
    order = list(reversed(range(len(params)))) if input_shape is None else ready_order(model, input_shape)
    cap = int(bucket_mb * 1024 * 1024)
    rebuilt, _ = dist._compute_bucket_assignment_by_size([params[i] for i in order], [cap, cap], [], order)
    return [list(b) for b in reversed(first)], [list(b) for b in rebuilt]


class HookBucket:
    """What torch's hooks read of a ``dist.GradBucket``: bucket ``index`` of ``count``, a
    flat ``buffer`` and its views per parameter (in the bucket's order)."""

    def __init__(self, index: int, count: int, buffer: Tensor, params: list[nn.Parameter]):
        self._index, self._count, self._buffer, self._params = index, count, buffer, params
        self._grads, at = [], 0
        for p in params:
            self._grads.append(buffer[at : at + p.numel()].view_as(p))
            at += p.numel()

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._index == self._count - 1

    def buffer(self) -> Tensor:
        return self._buffer

    def gradients(self) -> list[Tensor]:
        return self._grads

    def parameters(self) -> list[nn.Parameter]:
        return self._params


class HookGroup:
    """What the P virtual ranks of a hook reducer share: the model's trainable parameters
    and their slices of the flat gradient, DDP's bucket layouts, the in-process all-reduce,
    and the steps run since the group was made (a new DDP's first uses the first layout)."""

    def __init__(self, world: int, model: nn.Module, input_shape: tuple[int, ...] | None, bucket_mb: float):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.slices, at = [], 0
        for p in self.params:
            self.slices.append((at, p.numel()))
            at += p.numel()
        self.first, self.rebuilt = ddp_layouts(model, input_shape, bucket_mb)
        self.allreduce = InProcessAllReduce(world)
        self.steps = 0

    def group(self, rank: int) -> VirtualGroup:
        return VirtualGroup(rank, self.allreduce)

    def bucket(self, index: int, layout: Layout, grad: Tensor) -> HookBucket:
        """Bucket ``index`` of ``layout`` filled from one rank's flat gradient (a copy, as DDP copies)."""
        members = layout[index]
        buffer = torch.cat([grad[o : o + n] for o, n in (self.slices[i] for i in members)])
        return HookBucket(index, len(layout), buffer, [self.params[i] for i in members])

    def scatter(self, layout: Layout, index: int, result: Tensor, out: Tensor) -> None:
        """Bucket ``index``'s result into the flat ``out`` (parameter order)."""
        at = 0
        for i in layout[index]:
            o, n = self.slices[i]
            out[o : o + n].copy_(result[at : at + n])
            at += n


def hook_group(workers: list, grads: list[Tensor]) -> tuple[Tensor, list[ReduceRecord]]:
    """Local. What rank i of a DDP job with ``workers[i]``'s hook gets as its averaged
    gradient, from the P ranks' flat gradients: each bucket's P hook calls
    (``communicate``), bucket after bucket as DDP issues them. Returns the update and
    each rank's record (``DDPReducer.record``: the elements the hooks' all-reduces carried)."""
    P, m = len(workers), grads[0].numel()
    shared: HookGroup | None = workers[0].simulation
    recs = [ReduceRecord() for _ in workers]
    if shared is None and P > 1:
        raise ValueError(
            f"{type(workers[0]).__name__}.reduce_group needs prepare_group(workers, model, input_shape) first"
        )
    if shared is None:  # one rank: DDP is not used, the gradient is the update
        for w, rec in zip(workers, recs):
            w.record(rec, [], m, P)
        return grads[0].detach().clone(), recs
    layout = shared.first if shared.steps == 0 else shared.rebuilt
    shared.steps += 1
    update = torch.empty_like(grads[0])
    sent: list[int] = []
    for index in range(len(layout)):
        calls = [w.communicate(w.comm_state, shared.bucket(index, layout, g)) for w, g in zip(workers, grads)]
        results = shared.allreduce.wait([fut for fut, _ in calls])
        sent += calls[0][1]
        value = results[0][0] if isinstance(results[0], list) else results[0]  # every rank's is the same
        shared.scatter(layout, index, value, update)
    for w, rec in zip(workers, recs):
        w.record(rec, [n for n in sent if n], m, P)
    return update, recs
