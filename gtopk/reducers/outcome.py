"""``ReduceRecord``: what one ``Reducer.reduce`` call did on one rank (its selection, traffic,
times and diagnostics), which every reducer fills and the training loop and benchmarks write
into their records (``gtopk.train.rows``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class ReduceRecord:
    """What one ``reduce`` call did on this rank.

    selected: entries this worker selected (m for dense).
    bytes_sent / bytes_recv / messages_sent: this rank's traffic (see gtopk.reducers.costmodel
        for which counts are exact and which nominal).
    t_compr: seconds in local work on the residual (add, top-k selection, put-back).
    t_commu: seconds in the collective: from the selected entries to every rank holding the
        aggregated ones (packing, messages, unpacking, merges). Scattering them into the
        dense update (and summing Top-k's P sets) is applying it: the training loop counts
        it in t_update. (The paper's t_commu includes that scatter.)
    t_merge: the part of t_commu spent in gTop-k's merges.
    payload_bytes: bytes of the tensors the step's all-reduces carried (the DDP hook
        baselines: fp32 buckets, fp16 buckets, or PowerSGD's uncompressed tensors, Ps and
        Qs, from the hook itself); None for the reducers that do not report it.
    With ``Reducer.diagnostics`` (else None): update_nnz, coordinates the update writes (the
    same on every rank); residual_norm, L2 of this rank's residual after the step (0: none);
    lost_l1, gradient neither applied nor kept (gTop-k ``putback=index``: L1 of the partial
    sums dropped by the merges this rank owns whose index still reached the final set; the
    step's loss is the sum over ranks, exact unless two drops at one index cancel; else 0).
    """

    selected: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    messages_sent: int = 0
    t_compr: float = 0.0
    t_commu: float = 0.0
    t_merge: float = 0.0  # part of t_commu spent merging sparse vectors (gTop-k)
    update_nnz: int | None = None
    residual_norm: float | None = None
    lost_l1: float | None = None
    payload_bytes: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def set_traffic(self, traffic) -> None:
        """Copy a ``gtopk.reducers.costmodel.Traffic`` (nominal counts of a backend collective)."""
        self.messages_sent = traffic.messages_sent
        self.bytes_sent = traffic.bytes_sent
        self.bytes_recv = traffic.bytes_recv
