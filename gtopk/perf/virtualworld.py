"""A recorded world: every rank of a P-rank group runs the reducers' own code in one
process, over a stand-in for the ``torch.distributed`` calls they make, and every message
and collective call is recorded (docs/reducers.md, "The schedules at scale").

Real: everything above ``torch.distributed`` -- ``Reducer.reduce``, the schedules, the
wire format and the counted ``PointToPoint`` layer -- each rank in its own thread with its
own reducer and buffers; what a rank receives is what its partner sent. Stood in
(``RecordedWorld.patched``): ``send``/``recv``/``isend``/``irecv``/``P2POp``/
``batch_isend_irecv`` (matched messages between the threads); ``all_gather``/
``all_reduce``/``all_gather_object``/``barrier`` (one recorded call per rank, computed in
rank order: the backend's own algorithm inside is not run); ``is_initialized``/
``get_world_size``/``get_rank``/``get_global_rank``/``get_backend``. Any other call reaches the real,
uninitialised ``torch.distributed`` and fails.

Messages: sender and receiver buffers must have the same size; a rank may not message
itself. ``eager=False`` (default): a message completes when both halves are posted, at
``max(s, r) + alpha + nbytes * beta`` on both ranks' clocks (rendezvous: gloo's TCP
transport sends only once the receiver has posted). ``eager=True``: the sender is done
at ``s + alpha + nbytes * beta`` whether or not the receiver has posted, the receiver at
``max(r, that)`` (a buffering transport: MPI's eager protocol for small messages, as
under the paper's mpi4py). Each rank keeps one logical clock per ``Network`` of
``nets``, set by the operations it waits for; local work costs nothing (the cost model
leaves merges out too). On ``ROUNDS`` a clock counts messages on the critical path, on
``BYTES`` its bytes. A collective sets every rank's clocks to the latest caller's plus
``collective_cost(kind, nbytes, word, P, net)`` (bytes per rank and per element; None,
the default: nothing added), the time the caller's model gives the backend's algorithm
for that call (``gtopk.perf.schedulecheck``: the textbook rings of
``gtopk.reducers.costmodel``).

The ranks run one at a time (cooperative threads, in a deterministic order:
``gtopk.perf.cooperative.CooperativeRanks``); if every unfinished rank waits on something no
rank will do, ``run`` raises ``gtopk.perf.cooperative.Deadlock`` naming them. ``run`` patches
the ``torch.distributed`` module while it runs (``patched``): one world at a time per process,
and nothing else in it may use ``torch.distributed`` meanwhile.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from unittest import mock

import torch
import torch.distributed as dist

from gtopk.perf.cooperative import CooperativeRanks
from gtopk.reducers.costmodel import Network

ROUNDS = Network(alpha=1.0, beta=0.0)  # a clock that counts messages on the critical path
BYTES = Network(alpha=0.0, beta=1.0)  # a clock that counts bytes on the critical path


#: (kind, bytes per rank, bytes per element, P, network) -> the time a backend collective call adds to every rank's clock
CollectiveCost = Callable[[str, int, int, int, Network], float]


@dataclass
class Message:
    """One point-to-point message: ``done`` is its completion time on each network."""

    src: int
    dst: int
    nbytes: int
    done: tuple[float, ...]


@dataclass
class Collective:
    """One rank's call of a backend collective (the n-th collective call it made)."""

    n: int
    rank: int
    kind: str
    nbytes: int
    word: int = 1  # bytes per element of the tensor passed


@dataclass
class _Op:
    rank: int
    peer: int
    send: bool
    tensor: torch.Tensor
    posted: tuple[float, ...]
    done: tuple[float, ...] | None = None


@dataclass
class _Call:
    kind: str
    args: dict[int, tuple] = field(default_factory=dict)
    done: bool = False


class _Work:
    def __init__(self, wait: Callable[[], None]):
        self.wait = wait


class RecordedWorld(CooperativeRanks):
    """P ranks in one process; ``run(fn)`` calls ``fn(rank)`` on every rank (collective
    calls inside reach the stand-in) and returns the P results. ``messages`` and
    ``collectives`` hold what was recorded; ``clocks[rank]`` each rank's final clocks, one
    per network of ``nets``."""

    def __init__(
        self,
        P: int,
        nets: tuple[Network, ...] = (ROUNDS, BYTES),
        eager: bool = False,
        stack_kib: int = 512,
        collective_cost: CollectiveCost | None = None,
    ):
        super().__init__(P, stack_kib)
        self.nets, self.eager = tuple(nets), eager
        self.collective_cost = collective_cost
        self.messages: list[Message] = []
        self.collectives: list[Collective] = []
        self.clocks = [tuple(0.0 for _ in nets) for _ in range(P)]
        self._pending: dict[tuple[int, int, bool], deque[_Op]] = {}
        self._calls: dict[int, _Call] = {}
        self._ncalls = [0] * P

    # ------------------------------------------------------------ point to point
    def _post(self, send: bool, tensor: torch.Tensor, peer: int) -> _Op:
        me = self.rank
        if not 0 <= peer < self.P or peer == me:
            raise ValueError(f"rank {me} addressed rank {peer} in a group of {self.P}")
        if not tensor.is_contiguous():
            raise ValueError(f"rank {me} passed a non-contiguous tensor to a point-to-point call")
        op = _Op(me, peer, send, tensor, self.clocks[me])
        if send and self.eager:  # buffered: the sender is done when its message is out
            op.tensor = tensor.clone()
            op.done = self._after(op.posted, tensor.numel() * tensor.element_size())
        src, dst = (me, peer) if send else (peer, me)
        mirror = self._pending.get((src, dst, not send))
        if not mirror:
            self._pending.setdefault((src, dst, send), deque()).append(op)
            return op
        other = mirror.popleft()
        s, r = (op, other) if send else (other, op)
        nbytes = s.tensor.numel() * s.tensor.element_size()
        if r.tensor.numel() * r.tensor.element_size() != nbytes:
            raise ValueError(
                f"rank {src} sends {nbytes} bytes to rank {dst}, which receives "
                f"{r.tensor.numel() * r.tensor.element_size()}"
            )
        r.tensor.view(torch.uint8).view(-1).copy_(s.tensor.view(torch.uint8).view(-1))
        if self.eager:
            r.done = tuple(max(a, b) for a, b in zip(r.posted, s.done))
        else:
            s.done = r.done = self._after(tuple(max(a, b) for a, b in zip(s.posted, r.posted)), nbytes)
        self.messages.append(Message(src, dst, nbytes, r.done))
        self._wake(other.rank)
        return op

    def _after(self, start: tuple[float, ...], nbytes: int) -> tuple[float, ...]:
        return tuple(t + n.msg(nbytes) for t, n in zip(start, self.nets))

    def _wait(self, op: _Op) -> None:
        what = f"{'send to' if op.send else 'recv from'} {op.peer}"
        self._block(op.rank, what, lambda: op.done is not None)
        self.clocks[op.rank] = tuple(max(a, b) for a, b in zip(self.clocks[op.rank], op.done))

    def send(self, tensor: torch.Tensor, dst: int, group=None, tag: int = 0) -> None:
        self._wait(self._post(True, tensor, dst))

    def recv(self, tensor: torch.Tensor, src: int, group=None, tag: int = 0) -> int:
        self._wait(self._post(False, tensor, src))
        return src

    def isend(self, tensor: torch.Tensor, dst: int, group=None, tag: int = 0) -> _Work:
        op = self._post(True, tensor, dst)
        return _Work(lambda: self._wait(op))

    def irecv(self, tensor: torch.Tensor, src: int, group=None, tag: int = 0) -> _Work:
        op = self._post(False, tensor, src)
        return _Work(lambda: self._wait(op))

    def batch_isend_irecv(self, ops: list) -> list[_Work]:
        return [op.op(op.tensor, op.peer, op.group) for op in ops]

    # ------------------------------------------------------------ collectives
    def _collective(
        self, kind: str, nbytes: int, arg: tuple, finish: Callable[[dict[int, tuple]], None], word: int = 1
    ) -> None:
        """This rank's part of the n-th collective call; ``finish(args by rank)`` runs once,
        when the last rank has called. Blocks until then."""
        me = self.rank
        n = self._ncalls[me]
        self._ncalls[me] += 1
        call = self._calls.setdefault(n, _Call(kind))
        if call.kind != kind:
            raise ValueError(f"collective call {n}: rank {me} calls {kind}, an earlier rank {call.kind}")
        call.args[me] = (nbytes, self.clocks[me], *arg)
        self.collectives.append(Collective(n, me, kind, nbytes, word))
        if len(call.args) == self.P:
            sizes = {a[0] for a in call.args.values()}
            if len(sizes) > 1 and kind != "all_gather_object":
                raise ValueError(f"collective call {n} ({kind}): the ranks pass different sizes {sorted(sizes)}")
            finish(call.args)
            latest = tuple(max(a[1][i] for a in call.args.values()) for i in range(len(self.nets)))
            if self.collective_cost is not None:
                cost = self.collective_cost
                latest = tuple(t + cost(kind, nbytes, word, self.P, net) for t, net in zip(latest, self.nets))
            for r in range(self.P):
                self.clocks[r] = latest
                self._wake(r)
            call.done = True
        self._block(me, f"{kind} (call {n})", lambda: call.done)

    def all_gather(self, tensor_list: list, tensor: torch.Tensor, group=None, async_op: bool = False):
        def finish(args):
            for a in args.values():
                for src in range(self.P):
                    a[2][src].copy_(args[src][3])

        nbytes = tensor.numel() * tensor.element_size()
        self._collective("all_gather", nbytes, (tensor_list, tensor), finish, tensor.element_size())
        return _Work(lambda: None) if async_op else None

    def all_reduce(self, tensor: torch.Tensor, op=None, group=None, async_op: bool = False):
        if op not in (None, dist.ReduceOp.SUM):
            raise ValueError(f"the recorded world's all_reduce sums; got op={op}")

        def finish(args):
            total = args[0][2].clone()
            for r in range(1, self.P):  # rank order
                total.add_(args[r][2])
            for a in args.values():
                a[2].copy_(total)

        self._collective("all_reduce", tensor.numel() * tensor.element_size(), (tensor,), finish, tensor.element_size())
        return _Work(lambda: None) if async_op else None

    def all_gather_object(self, object_list: list, obj: object, group=None) -> None:
        def finish(args):
            gathered = [args[r][3] for r in range(self.P)]
            for a in args.values():
                a[2][:] = gathered

        self._collective("all_gather_object", 0, (object_list, obj), finish)

    def barrier(self, group=None, **_) -> None:
        self._collective("barrier", 0, (), lambda args: None)

    # ------------------------------------------------------------ the stand-in
    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        """``torch.distributed``'s functions that the reducers call, routed to this world."""
        world = self

        class P2POp:  # dist.P2POp's fields; ``op`` is this world's isend or irecv
            def __init__(self, op, tensor, peer, group=None, tag=0):
                self.op, self.tensor, self.peer, self.group = op, tensor, peer, group

        stand_in = {
            "is_initialized": lambda: True,
            "get_world_size": lambda group=None: world.P,
            "get_rank": lambda group=None: world.rank,
            "get_global_rank": lambda group, group_rank: group_rank,
            "get_backend": lambda group=None: "recorded",  # not gloo: the rounds take the calls above
            "send": self.send,
            "recv": self.recv,
            "isend": self.isend,
            "irecv": self.irecv,
            "P2POp": P2POp,
            "batch_isend_irecv": self.batch_isend_irecv,
            "all_gather": self.all_gather,
            "all_reduce": self.all_reduce,
            "all_gather_object": self.all_gather_object,
            "barrier": self.barrier,
        }
        with mock.patch.multiple(dist, **stand_in):
            yield
