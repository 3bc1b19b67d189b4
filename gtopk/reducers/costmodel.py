"""Alpha-beta cost model of the reducers: time on the critical path, and per-rank traffic.

A point-to-point message of n bytes costs ``alpha + n * beta`` (alpha in seconds, beta in
seconds per byte). Links are full duplex: a pairwise exchange costs one message time.
``paper_table1`` gives the paper's Table I formulas as printed (beta per 4-byte word);
the other functions describe what this package's reducers actually do.

Traffic (``Traffic``) is what one rank sends and receives. For ``gtopk`` these are the
point-to-point messages the reducer issues, and its records match them exactly. ``dense``
and ``topk`` call backend collectives whose internal algorithm the backend chooses; their
traffic is that of the textbook algorithm the time formula assumes (ring all-reduce with
equal chunks; recursive-doubling all-gather), and their records report the same nominal
counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

VALUE_BYTES = 4  # float32 on the wire


@dataclass(frozen=True)
class Network:
    """alpha: seconds per message; beta: seconds per byte; software: seconds that a message of
    this package's own sparse rounds costs beyond alpha (posting, encoding and decoding, the
    merge's bookkeeping, waking the rank: ``gtopk.perf.software`` measures it), 0 unknown;
    ring_alpha: seconds per step of the backend's own collectives (its ring all-reduce and
    all-gather: ``ring_msg``), None where not measured (then alpha). gloo's TCP pairs send a
    message only once its receiver has posted the receive, and a ring step posts both at once:
    the step pays a notice's crossing before the data's (``gtopk.perf.netbench.ring_latency``)."""

    alpha: float
    beta: float
    software: float = 0.0
    ring_alpha: float | None = None

    @property
    def sparse(self) -> Network:
        """The network a message of this package's sparse rounds sees: alpha + software. The
        sparse reducers' ``predict_commu`` pass it to their formulas; the backend's own
        collectives (dense all-reduce, DDP, PowerSGD, Top-k's all-gather: gloo's or NCCL's
        C++) use ``self`` (PowerSGD's small all-reduces: its ``software`` where it exceeds a
        ring step's wire time, ``software_ring_time``)."""
        return Network(alpha=self.alpha + self.software, beta=self.beta)

    @classmethod
    def paper(cls) -> Network:
        """The authors' fit on their 1 Gbit/s cluster: 0.436 ms, 9e-6 ms/byte."""
        return cls(alpha=0.436e-3, beta=9e-9)

    def msg(self, nbytes: float) -> float:
        return self.alpha + nbytes * self.beta

    def ring_msg(self, nbytes: float) -> float:
        """One step of the backend's own ring collectives, carrying ``nbytes``."""
        return (self.alpha if self.ring_alpha is None else self.ring_alpha) + nbytes * self.beta


@dataclass(frozen=True)
class Traffic:
    messages_sent: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(
            self.messages_sent + other.messages_sent,
            self.bytes_sent + other.bytes_sent,
            self.bytes_recv + other.bytes_recv,
        )


def index_bytes(m: int) -> int:
    """Wire width of an index: int32, or int64 when the model has 2^31 entries or more."""
    return 4 if m < 2**31 else 8


def log2_ceil(P: int) -> int:
    return (P - 1).bit_length()


def _pow2_floor(P: int) -> int:
    return 1 << (P.bit_length() - 1)


# ---------------------------------------------------------------- the paper's Table I
def paper_table1(P: int, m: int, k: int, alpha: float, beta_word: float) -> dict[str, float]:
    """Table I of the paper, with beta per 4-byte word (log2 P taken as-is)."""
    lg = math.log2(P) if P > 1 else 0.0
    return {
        "dense": 2 * (P - 1) * alpha + 2 * (P - 1) / P * m * beta_word,
        "topk": alpha * lg + 2 * (P - 1) * k * beta_word,
        "gtopk": 2 * alpha * lg + 4 * k * beta_word * lg,
    }


# ---------------------------------------------------------------- dense: ring all-reduce
def ring_chunk(n: int, P: int) -> int:
    """Elements per chunk of a ring all-reduce of n elements (equal chunks, padded)."""
    return -(-n // P)


def dense_traffic(P: int, bucket_sizes: list[int], word: int = VALUE_BYTES) -> Traffic:
    """Per rank, per bucket: 2(P-1) messages of one chunk each, sent and received."""
    if P == 1:
        return Traffic()
    elems = sum(2 * (P - 1) * ring_chunk(n, P) for n in bucket_sizes)
    return Traffic(2 * (P - 1) * len(bucket_sizes), elems * word, elems * word)


def dense_time(P: int, bucket_sizes: list[int], net: Network, word: int = VALUE_BYTES) -> float:
    if P == 1:
        return 0.0
    return sum(2 * (P - 1) * net.ring_msg(ring_chunk(n, P) * word) for n in bucket_sizes)


# ---------------------------------------------------------------- topk: all-gather
def topk_traffic(P: int, k: int, m: int) -> Traffic:
    """Ring all-gather of k packed (index, value) entries per rank: P - 1 steps, each passing
    one rank's k entries on. That is what gloo's and NCCL's all-gather run (recorded at
    P up to 1,024 by ``gtopk.perf.schedulecheck``); the paper's Table I assumes a
    recursive-doubling one (alpha log2 P), which ``paper_table1`` keeps."""
    if P == 1:
        return Traffic()
    n = (P - 1) * k * (index_bytes(m) + VALUE_BYTES)
    return Traffic(P - 1, n, n)


def topk_time(P: int, k: int, m: int, net: Network) -> float:
    if P == 1:
        return 0.0
    return (P - 1) * net.ring_msg(k * (index_bytes(m) + VALUE_BYTES))


# ---------------------------------------------------------------- gtopk
def tree_children(rank: int, P: int) -> int:
    """Ranks that send to ``rank`` in the binomial tree (and that it broadcasts to)."""
    return sum(1 for r in range(log2_ceil(P)) if rank % (1 << (r + 1)) == 0 and rank + (1 << r) < P)


def rd_traffic(rank: int, P: int, nbytes: int, back_bytes: int | None = None) -> Traffic:
    """Recursive doubling with folding: ranks >= P2 send once and get ``back_bytes`` back."""
    back = nbytes if back_bytes is None else back_bytes
    P2 = _pow2_floor(P)
    if rank >= P2:
        return Traffic(1, nbytes, back)
    rounds = P2.bit_length() - 1
    t = Traffic(rounds, rounds * nbytes, rounds * nbytes)
    if rank + P2 < P:
        t = t + Traffic(1, back, nbytes)
    return t


def rd_time(P: int, nbytes: int, net: Network, back_bytes: int | None = None) -> float:
    back = nbytes if back_bytes is None else back_bytes
    P2 = _pow2_floor(P)
    fold = net.msg(nbytes) + net.msg(back) if P != P2 else 0.0
    return fold + (P2.bit_length() - 1) * net.msg(nbytes)


def gtopk_traffic(rank: int, P: int, k: int, m: int, algorithm: str, putback: str) -> Traffic:
    """What ``rank`` sends and receives in one gTopKAllReduce (exact, per message)."""
    if P == 1:
        return Traffic()
    entry = k * (index_bytes(m) + VALUE_BYTES)
    final = entry if putback == "index" else k * index_bytes(m)  # exact re-sums values
    if algorithm == "tree":
        kids = tree_children(rank, P)
        up = Traffic(0 if rank == 0 else 1, 0 if rank == 0 else entry, kids * entry)
        down = Traffic(kids, kids * final, 0 if rank == 0 else final)
        t = up + down
    else:
        t = rd_traffic(rank, P, entry, final)
    if putback == "exact":
        t = t + rd_traffic(rank, P, k * VALUE_BYTES)
    return t


def gtopk_time(P: int, k: int, m: int, net: Network, algorithm: str, putback: str) -> float:
    """Critical-path time of one gTopKAllReduce (communication only, no merge cost)."""
    if P == 1:
        return 0.0
    entry = k * (index_bytes(m) + VALUE_BYTES)
    final = entry if putback == "index" else k * index_bytes(m)
    if algorithm == "tree":
        t = log2_ceil(P) * (net.msg(entry) + net.msg(final))
    else:
        t = rd_time(P, entry, net, final)
    if putback == "exact":
        t += rd_time(P, k * VALUE_BYTES, net)
    return t


# ---------------------------------------------------------------- DDP's buckets; the hook baselines
#: fraction of a step's compute in the forward pass (backward ~ 2x forward): the replay of a
#: hooked backward (``gtopk.train.replay_backward``) and this model share it
FORWARD_SHARE = 1.0 / 3.0


def ready_offsets(ndims: Sequence[int], t_compute: float, forward_share: float = FORWARD_SHARE) -> list[float]:
    """When each parameter's gradient is ready, seconds after the step starts, for
    parameters of ``ndims`` dimensions in model (forward) order: the forward pass takes
    ``forward_share`` of ``t_compute``, then backward walks the layers in reverse, an equal
    share per parameter with ndim >= 2; a 1-D parameter (bias, norm) is ready with the weight
    before it. The last gradient is ready at ``t_compute``."""
    layer, of = 0, []
    for d in ndims:
        layer += d >= 2
        of.append(max(layer, 1))
    layers = max(layer, 1)
    share = (1.0 - forward_share) * t_compute / layers
    return [forward_share * t_compute + (layers - n + 1) * share for n in of]


def ddp_bucket_indices(shapes: Sequence[tuple[int, ...]], bucket_mb: float, word: int = VALUE_BYTES) -> list[list[int]]:
    """DDP's buckets after its rebuild at the end of the first iteration (what every later
    step all-reduces), as indices into ``shapes`` (parameters in model order): gradients in
    the order backward produces them (last layer first, for a sequential model), a bucket
    closing once it holds ``bucket_mb`` MiB or more (one tensor may take it over). The first
    bucket has the same cap when ``bucket_cap_mb`` is given, as ``baselines`` does."""
    cap, out, cur, size = int(bucket_mb * 2**20), [], [], 0
    for i in reversed(range(len(shapes))):
        cur.append(i)
        size += math.prod(shapes[i]) * word
        if size >= cap:
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


def ddp_buckets(
    shapes: Sequence[tuple[int, ...]], bucket_mb: float, word: int = VALUE_BYTES
) -> list[list[tuple[int, ...]]]:
    """``ddp_bucket_indices`` as the parameters' shapes."""
    return [[tuple(shapes[i]) for i in b] for b in ddp_bucket_indices(shapes, bucket_mb, word)]


def overlapped_time(ready: Sequence[float], times: Sequence[float]) -> float:
    """When the last of a sequence of communications ends, the i-th starting once it is
    ready (``ready[i]``) and the one before it has ended (one after another, in order, as a
    process group runs a rank's collectives), each taking ``times[i]``."""
    end = 0.0
    for r, t in zip(ready, times, strict=True):
        end = max(end, r) + t
    return end


def powersgd_matrix(shape: tuple[int, ...], rank: int, min_compression_rate: float) -> tuple[bool, int, int, int]:
    """torch's PowerSGD rule for one gradient (``powerSGD_hook``'s Step I with
    ``_should_compress``): viewed as an n x m matrix (n = shape[0]) of rank r = min(n, m,
    rank), it is compressed to P (n x r) and Q (m x r) when (n + m) r times
    ``min_compression_rate`` < n m, else all-reduced as it is. Returns (compressed, n, m, r)."""
    n = shape[0]
    m = math.prod(shape) // n
    r = min(n, m, rank)
    return (n + m) * r * min_compression_rate < n * m, n, m, r


def powersgd_allreduces(bucket: list[tuple[int, ...]], rank: int, min_compression_rate: float) -> list[int]:
    """Elements of the three all-reduces PowerSGD issues for one bucket, one after the
    other: the uncompressed tensors (concatenated), then all Ps, then all Qs."""
    plain = ps = qs = 0
    for shape in bucket:
        compressed, n, m, r = powersgd_matrix(shape, rank, min_compression_rate)
        if compressed:
            ps, qs = ps + n * r, qs + m * r
        else:
            plain += n * m
    return [plain, ps, qs]


def ring_time(P: int, n: int, net: Network, word: int = VALUE_BYTES) -> float:
    """One ring all-reduce of n elements (none for an empty tensor)."""
    return 0.0 if P == 1 or n == 0 else 2 * (P - 1) * net.ring_msg(ring_chunk(n, P) * word)


def software_ring_time(P: int, n: int, net: Network, word: int = VALUE_BYTES) -> float:
    """One ring all-reduce of n elements whose 2(P - 1) steps each cost a ring step's latency
    (``Network.ring_msg``) + max(software, chunk bytes x beta): a step's per-message software
    cost (``Network.software``) overlaps
    its wire time, so it shows in small, latency-bound all-reduces and hides in large ones
    (where this is ``ring_time``). With ``software`` 0 it is ``ring_time``."""
    if P == 1 or n == 0:
        return 0.0
    return 2 * (P - 1) * (net.ring_msg(0) + max(net.software, ring_chunk(n, P) * word * net.beta))


def powersgd_time(
    P: int, buckets: list[list[tuple[int, ...]]], net: Network, rank: int, min_compression_rate: float
) -> float:
    """Critical-path time of one step of torch's PowerSGD hook: per bucket, the ring
    all-reduces of the uncompressed tensors, of P and of Q one after the other, each
    ``software_ring_time`` (its latency and software terms), the buckets one after another.
    Compression arithmetic not counted (a P = 1 job's t_compr: ``DDPReducer.time_hook_alone``)."""
    return sum(
        software_ring_time(P, n, net)
        for bucket in buckets
        for n in powersgd_allreduces(bucket, rank, min_compression_rate)
    )
