"""gTop-k S-SGD: gTopKAllReduce over counted point-to-point messages."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import Tensor

from gtopk import host
from gtopk.host import Clock
from gtopk.reducers import native, reference
from gtopk.reducers import transport as tcp
from gtopk.reducers.base import SparseReducer
from gtopk.reducers.costmodel import Network, gtopk_time
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.schedules import (
    Payload,
    recursive_doubling,
    recursive_doubling_owned,
    recursive_doubling_receives,
    tree_broadcast,
    tree_reduce,
    tree_reduce_first,
)
from gtopk.reducers.selection import Selector
from gtopk.reducers.selection.exact import k_for
from gtopk.reducers.selection.sampled import MAX_REFINE, SAMPLE_RATIO
from gtopk.reducers.sparse import member_mask, merge
from gtopk.reducers.wire import PointToPoint, RoundTrace, SparseCodec

ALGORITHMS = ("tree", "recursive_doubling")
PUTBACKS = ("index", "exact")


class GTopKReducer(SparseReducer):
    """Global top-k: local exact top-k with error feedback, then the k-entry sparse
    vectors are merged (sum at shared indices, keep the k largest |value|, ties to the
    smaller index) over point-to-point messages (collective as a whole: every rank must call
    ``reduce``): on the CPU over the rounds' own sockets (``transport``, see
    ``SparseReducer``), on CUDA ``dist.send``/``dist.recv``/``batch_isend_irecv``.

    algorithm:
      ``tree``: binomial tree to rank 0 (ceil(log2 P) rounds), then binomial broadcast.
      ``recursive_doubling``: partners exchange and both merge; ranks above the largest
        power of two fold into a partner first and get the result back after.
    putback:
      ``index``: the paper's rule, gradient loss included (see gtopk.reducers.reference.gtopk).
      ``exact``: the final indices F are broadcast (indices only), then every rank's
        full acc[F] is summed by recursive doubling and applied; each rank keeps acc
        outside F. No gradient is lost.
    selection: ``exact`` (the k largest) or ``sampled`` (DGC's sampled threshold, at most
      k selected, the message padded to k: ``gtopk.reducers.selection``).
    Every message carries 8 bytes per entry (int32 index + float32 value).
    """

    display_name = "gTop-k"
    plot_order = 60

    @classmethod
    def declared(cls, settings=None):
        """The exact put-back is shown as a reducer of its own, right after the paper's."""
        if (settings or {}).get("putback") == "exact":
            return replace(super().declared(settings), display_name="gTop-k exact", plot_order=61.0)
        return super().declared(settings)

    def reference(self, grads: list[Tensor], residuals: list[Tensor | None] | None = None):
        """Local. ``gtopk.reducers.reference.gtopk`` of residual + gradient, these settings
        (the exact selection's semantics)."""
        accs = [g if r is None else r + g for g, r in zip(grads, residuals or [None] * len(grads))]
        k = k_for(self.density, grads[0].numel())
        return reference.gtopk(accs, k, algorithm=self.algorithm, putback=self.putback)

    def __init__(
        self,
        density: float,
        algorithm: str = "tree",
        putback: str = "index",
        group: dist.ProcessGroup | None = None,
        align_timing: bool = False,
        selection: str = "exact",
        sample_ratio: float = SAMPLE_RATIO,
        max_refine: int = MAX_REFINE,
        transport: str = "auto",
    ):
        self.selector = Selector(selection, sample_ratio, max_refine)  # gtopk.reducers.selection
        if algorithm not in ALGORITHMS:
            raise ValueError(f"reducer.algorithm={algorithm!r} is unknown; choose one of {', '.join(ALGORITHMS)}")
        if putback not in PUTBACKS:
            raise ValueError(f"reducer.putback={putback!r} is unknown; choose one of {', '.join(PUTBACKS)}")
        super().__init__(density, group, align_timing)
        self._set_transport(transport)  # the rounds' sockets or the backend's calls (``SparseReducer``)
        if transport == "native" and native.why_unavailable():
            raise ValueError(
                f"reducer.transport=native: the compiled rounds are unavailable ({native.why_unavailable()}); "
                "use reducer.transport=socket"
            )
        self.algorithm = algorithm
        self.putback = putback
        self.selection = selection
        #: the exact put-back keeps every entry not applied; the paper's loses what an early merge dropped
        self.conserves = putback == "exact"  # type: ignore[misc]
        self._plan: tuple | None = None  # the compiled rounds' prepared call (``_rounds_compiled``)

    @classmethod
    def predict_commu(
        cls, P: int, m: int, net: Network, density: float = 0.001, algorithm: str = "tree", putback: str = "index", **_
    ) -> float:
        """Messages of gTopKAllReduce on the critical path (merges not included), each this
        package's own point-to-point round: alpha + software (``Network.sparse``)."""
        return gtopk_time(P, k_for(density, m), m, net.sparse, algorithm, putback)

    # -- the two ways to find the global set; both return (indices, values or None) --
    def _merge(self, a, b):
        """The gTop-k merge of two sparse vectors, its time added to the record's t_merge
        (with ``_drops`` a list: what it dropped is appended, None when nothing)."""
        t0 = self._clock()
        dropped = None if self._drops is None else []
        out = merge(*a, *b, self._k, dropped)
        if dropped is not None:
            self._drops.append(dropped[0] if dropped else None)
        self._rec.t_merge += self._clock() - t0
        return out

    def _lost_l1(self, final_idx: Tensor) -> float:
        """L1 of what this rank's owned merges dropped at indices that reached the final set."""
        owned = recursive_doubling_owned(self.rank, self.world_size) if self.algorithm != "tree" else None
        lost = 0.0
        for n, dropped in enumerate(self._drops or []):
            if dropped is not None and (owned is None or owned[n]):
                idx, val = dropped
                lost += float(val[member_mask(final_idx, idx)].abs().sum())
        return lost

    def _compiled(self, p2p) -> bool:
        """Whether this reduce's rounds run compiled (``gtopk.reducers.native``): on the rounds'
        sockets where compiled code may use them (``SparseReducer._compiled_sockets``)."""
        return p2p.transport is not None and p2p.transport is self._compiled_sockets()

    def _prepared(self, p2p, codec) -> native.Tree:
        """The compiled rounds' call for this reduce (arguments and buffers, made once per shape)."""
        key = (codec.k, codec.index_nbytes, self.putback, p2p.trace is not None, self._drops is not None)
        if self._plan is None or self._plan[0] != key:
            tree = native.Tree(
                p2p.transport.fds(), self.rank, codec.k, codec.index_nbytes // codec.k, self.putback == "index",
                algorithm=self.algorithm, spin_s=native.spin_seconds(self.world_size), dilation=host.dilation(),
                threads=max(1, torch.get_num_threads()), trace=key[3], drops=key[4],
            )  # fmt: skip
            self._plan = (key, tree)
        return self._plan[1]

    def _rounds_compiled(self, tree: native.Tree, p2p, item, align: int = 0):
        """``_tree`` or ``_recursive_doubling`` in one compiled call (``tree``: ``_prepared``;
        ``align``: ``native.Tree``'s), its messages, merges and events counted as
        ``PointToPoint`` and ``_merge`` count them; (indices, values or None, the call's span)."""
        pace = host.pacing_state() if tree.dilation > 1 else None
        idx, val, done = tree(*item, tcp.TIMEOUT_S, pace, align)
        self._count(done, p2p, pace)
        self._rec.t_merge += done.merge_s
        if self._drops is not None:
            self._drops.extend(d and tuple(torch.from_numpy(a) for a in d) for d in done.drops)
        return idx, val, done.span

    def _sum_compiled(self, tree: native.Tree, p2p, values: Tensor, align: int = 0) -> tuple[Tensor, tuple]:
        """``_sum_at`` in one compiled call (``native.Tree.sum``): (the sums, the call's span)."""
        pace = host.pacing_state() if tree.dilation > 1 else None
        out, done = tree.sum(values.numpy(), tcp.TIMEOUT_S, pace, align)
        self._count(done, p2p, pace)
        return torch.from_numpy(out), done.span

    def _count(self, done: native.Rounds, p2p, pace: list[float] | None) -> None:
        """A compiled call's messages and events, counted as ``PointToPoint`` counts them, and
        its pacing state handed back to ``gtopk.host``."""
        if pace is not None:
            host.set_pacing_state(pace)
        rec = self._rec
        rec.messages_sent += done.messages
        rec.bytes_sent += done.bytes_sent
        rec.bytes_recv += done.bytes_recv
        if p2p.trace is not None:  # ``PointToPoint`` marked it eager (a transport)
            p2p.trace.events.extend(done.events)

    def _tree(self, p2p, codec, sparse, k):
        P, rank, new = self.world_size, self.rank, codec.empty
        msg = Payload(codec.encode, codec.decode, codec.nbytes)
        root = tree_reduce(p2p, rank, P, sparse, self._merge, msg, new)
        if self.putback == "index":
            buf = codec.encode(root) if rank == 0 else None
            return codec.unpack(tree_broadcast(p2p, rank, P, buf, codec.nbytes, new))
        buf = codec.encode_indices(root) if rank == 0 else None
        return codec.unpack_indices(tree_broadcast(p2p, rank, P, buf, codec.index_nbytes, new)), None

    def _recursive_doubling(self, p2p, codec, sparse, k):
        msg = Payload(codec.encode, codec.decode, codec.nbytes)
        back = msg
        if self.putback == "exact":
            back = Payload(codec.encode_indices, lambda b: (codec.unpack_indices(b), None), codec.index_nbytes)
        return recursive_doubling(p2p, self.rank, self.world_size, sparse, self._merge, msg, back, codec.empty)

    def _sum_at(self, p2p, codec, values: Tensor) -> Tensor:
        """Recursive-doubling all-reduce (sum) of a k-vector of float32 values."""
        as_bytes = Payload(lambda v: v.view(torch.uint8), lambda b: b.view(torch.float32), 4 * values.numel())
        return recursive_doubling(
            p2p, self.rank, self.world_size, values, lambda a, b: a + b, as_bytes, as_bytes, codec.empty
        )

    def _first_receives(self, codec: SparseCodec) -> list[tuple[int, int]]:
        """The receives this rank's schedule posts first, (source, bytes): posted before the
        selection (``PointToPoint.post_early``)."""
        if self.algorithm == "tree":
            return tree_reduce_first(self.rank, self.world_size, codec.nbytes)
        back = codec.index_nbytes if self.putback == "exact" else codec.nbytes
        return recursive_doubling_receives(self.rank, self.world_size, codec.nbytes, back)

    def _reduce(self, grad: Tensor, rec: ReduceRecord, clock: Clock, out: Tensor | None = None) -> Tensor:
        P, m = self.world_size, grad.numel()
        k = k_for(self.density, m)
        self._k, self._rec, self._clock = k, rec, clock
        self._drops = [] if self.diagnostics and self.putback == "index" else None
        t0 = clock()
        p2p = PointToPoint(rec, self.peer, self.group, self.trace, self.p2p_transport(grad.device))
        codec = SparseCodec(k, m, grad.device)
        compiled = self._prepared(p2p, codec) if self._compiled(p2p) else None  # ``gtopk.reducers.native``
        if compiled is None:
            p2p.post_early(self._first_receives(codec), codec.empty)  # the selection hides them
        acc = self.feedback.accumulate(grad)
        picks = self.selector.pick(acc, k)  # k entries on the wire; ``own``: the selected ones
        sparse, own = (picks.idx, picks.val), picks.own()
        item = codec.item(*sparse)
        t1 = clock()
        # align_timing's barriers inside the compiled calls: the span starts as the ranks leave
        # the first, not after a return to Python, and ends with the last round (the sum's, exact)
        align = 0 if compiled is None or not self.align_timing else native.BEFORE | native.AFTER
        exact = self.putback == "exact"
        t1c = t1 if align else self._commu_start(clock)
        if compiled is not None:
            *tree_out, span = self._rounds_compiled(compiled, p2p, item, align & ~native.AFTER if exact else align)
            final_idx, final_val = codec.tensors(tree_out)
            t1c = span[0] if align else t1c
        else:
            schedule = {"tree": self._tree, "recursive_doubling": self._recursive_doubling}[self.algorithm]
            final_idx, final_val = codec.tensors(schedule(p2p, codec, item, k))
        if p2p.early_left():
            raise RuntimeError(f"gTop-k {self.algorithm}: {p2p.early_left()} receive(s) posted early were never used")
        if exact and compiled is not None:
            final_val, (_, end) = self._sum_compiled(compiled, p2p, acc[final_idx].contiguous(), align)
            span = (span[0], end)
        elif exact:
            final_val = self._sum_at(p2p, codec, acc[final_idx].contiguous())
        # every rank holds the final k entries: the collective is done
        if align & native.AFTER:
            t2 = span[1]
        else:
            self.commu_span = (t1c, t1c)  # ``_commu_end`` keeps its start
            t2 = self._commu_end(clock)
        self.commu_span = (t1c, t2)
        if self.putback == "exact":
            acc[final_idx] = 0
        else:
            acc[own[member_mask(final_idx, own)]] = 0
        t3 = clock()
        # applying it (scatter) is not communication; ``out`` may be the gradient's buffer
        # (the gradient is in acc, the residual, by now)
        update = torch.zeros_like(acc) if out is None else out.zero_()
        update[final_idx] = final_val / P
        rec.selected = own.numel()
        rec.t_compr = (t1 - t0) + (t3 - t2)
        rec.t_commu = t2 - t1c
        if self.diagnostics:  # from what this rank holds (the training loop counts it in t_update)
            rec.update_nnz, rec.residual_norm = final_idx.numel(), float(torch.linalg.vector_norm(acc))
            rec.lost_l1 = self._lost_l1(final_idx)
        return update

    #: a ``RoundTrace`` that each ``reduce`` appends its messages' events to (``gtopk.perf.trace``);
    #: None (the default): nothing is recorded
    trace: RoundTrace | None = None

    simulatable = True

    @classmethod
    def reduce_group(cls, workers, grads, accumulated=False):
        """Local: ``gtopk.reducers.inprocess.gtopk_group``."""
        from gtopk.reducers.inprocess import gtopk_group  # here: that module imports this package

        return gtopk_group(workers, grads, accumulated)
