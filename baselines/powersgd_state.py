"""PowerSGD's per-bucket state seen per parameter, so that it survives a new bucket layout.

torch's ``PowerSGDState`` keys the error-feedback buffers and the warm-start P and Q
memories by bucket index. DDP's buckets change: every DDP starts with one bucket of all
parameters and rebuilds them after its first backward pass, so a job resumed from a
checkpoint (a new DDP) sees other buckets under the same indices than the run that saved
it. Here the state is cut into per-parameter pieces along the layout the hook saw
(``Layout``) and reassembled for whatever bucket holds those parameters next, with the
offsets ``powerSGD_hook`` uses: the error buffer follows the bucket's flat gradient; P and
Q are laid out per shape group (first appearance) of the compressed tensors, in order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gtopk.reducers.costmodel import powersgd_matrix

#: per bucket: (parameter index, offset in the bucket's flat buffer, shape) of each gradient
Layout = tuple[tuple[int, int, tuple[int, ...]], ...]
Pieces = dict[int, dict[str, Tensor]]  # parameter index -> {"error", "p", "q"} (any subset)


def pq_offsets(layout: Layout, rank: int, min_rate: float) -> dict[int, tuple[int, int, int, int]]:
    """Parameter index -> (P offset, P length, Q offset, Q length) in the bucket's P and Q
    memories, for the compressed gradients (``powerSGD_hook`` groups them by matrix shape)."""
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for index, _, shape in layout:
        compressed, n, m, r = powersgd_matrix(shape, rank, min_rate)
        if compressed:
            groups.setdefault((n, m), []).append((index, r))
    out, p_at, q_at = {}, 0, 0
    for (n, m), members in groups.items():
        for index, r in members:
            out[index] = (p_at, n * r, q_at, m * r)
            p_at, q_at = p_at + n * r, q_at + m * r
    return out


def cut(state, layouts: dict[int, Layout], rank: int, min_rate: float) -> Pieces:
    """Local. Per-parameter copies of the state's buffers of every bucket in ``layouts``."""
    pieces: Pieces = {}
    for bucket, layout in layouts.items():
        error = state.error_dict.get(bucket)
        p_mem, q_mem = state.p_memory_dict.get(bucket), state.q_memory_dict.get(bucket)
        offsets = pq_offsets(layout, rank, min_rate)
        for index, offset, shape in layout:
            piece = pieces.setdefault(index, {})
            if error is not None:
                piece["error"] = error[offset : offset + _numel(shape)].clone()
            if p_mem is not None and q_mem is not None and index in offsets:
                p0, pn, q0, qn = offsets[index]
                piece["p"], piece["q"] = p_mem[p0 : p0 + pn].clone(), q_mem[q0 : q0 + qn].clone()
    return pieces


def assemble(state, bucket: int, layout: Layout, length: int, pieces: Pieces, rank: int, min_rate: float) -> None:
    """Local. Install the buffers of bucket ``bucket`` (``length`` elements, ``layout``)
    into ``state`` from ``pieces`` (those it takes are removed): the error buffer when every
    gradient of the bucket has one; P and Q when every compressed gradient has them."""
    mine = [pieces.get(index, {}) for index, _, _ in layout]
    if mine and all("error" in piece for piece in mine):
        first = mine[0]["error"]
        error = torch.zeros(length, dtype=first.dtype, device=first.device)
        for (_, offset, shape), piece in zip(layout, mine):
            error[offset : offset + _numel(shape)].copy_(piece["error"])
        state.error_dict[bucket] = error
    offsets = pq_offsets(layout, rank, min_rate)
    if offsets and all("p" in pieces.get(index, {}) for index in offsets):
        state.p_memory_dict[bucket] = torch.cat([pieces[i]["p"] for i in sorted(offsets, key=lambda i: offsets[i][0])])
        state.q_memory_dict[bucket] = torch.cat([pieces[i]["q"] for i in sorted(offsets, key=lambda i: offsets[i][2])])
    for index, _, _ in layout:
        pieces.pop(index, None)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def rng_to_tensors(rng) -> dict:
    """A numpy RandomState's state as tensors and numbers (``torch.load``'s weights-only
    reader accepts these, not numpy arrays)."""
    name, keys, pos, has_gauss, gauss = rng.get_state()
    return {"name": name, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos), "gauss": (has_gauss, gauss)}


def rng_from_tensors(rng, saved: dict) -> None:
    keys = saved["keys"].cpu().numpy().astype("uint32")
    rng.set_state((saved["name"], keys, saved["pos"], *saved["gauss"]))
