"""The sparse rounds' sockets (``gtopk.reducers.transport.SocketTransport``) on real worker
processes: messages between every pair arrive whole and in order, exchanges of messages
larger than any socket buffer do not deadlock, a peer that closes its connections is named
in a ``ConnectionError``, one that never sends in a ``TimeoutError`` that says "timed out"
(what the job's supervisor reports as a hung rank), both for the Python rounds and the
compiled tree (``gtopk.reducers.native``), and gTop-k gives the same update over
the sockets as over gloo's send/recv."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gtopk.reducers import GTopKReducer, native, transport
from gtopk.reducers.transport import SocketTransport
from gtopk.run.spawn import spawn

BIG = 6 * 2**20  # bytes: beyond the kernel's socket buffers on loopback


def payload(src: int, dst: int, n: int, nbytes: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * src + 10 * dst + n)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def all_pairs(rank: int, P: int) -> list[str]:
    """Every rank exchanges three messages of different sizes with every other at once, and
    one of BIG bytes with its ring neighbours (everyone sends before anyone reads)."""
    t = SocketTransport()
    sizes = (1, 2152, 70_001)
    recvs, sends = [], []
    for peer in range(P):
        if peer != rank:
            for n, size in enumerate(sizes):
                buf = torch.empty(size, dtype=torch.uint8)
                recvs.append((peer, n, buf, t.irecv(buf, peer)))
            sends += [t.isend(payload(rank, peer, n, size), peer) for n, size in enumerate(sizes)]
    for w in sends + [r[3] for r in recvs]:
        w.wait()
    bad = [
        f"{peer}->{rank} #{n}" for peer, n, buf, _ in recvs if not torch.equal(buf, payload(peer, rank, n, buf.numel()))
    ]
    big = torch.empty(BIG, dtype=torch.uint8)
    got = t.irecv(big, (rank - 1) % P)
    t.isend(payload(rank, (rank + 1) % P, 9, BIG), (rank + 1) % P).wait()
    got.wait()
    if not torch.equal(big, payload((rank - 1) % P, rank, 9, BIG)):
        bad.append(f"big {(rank - 1) % P}->{rank}")
    t.close()
    return bad


def test_messages_between_every_pair_arrive_whole_and_in_order():
    assert spawn(all_pairs, 4, timeout=300) == [[]] * 4


def wait_on_rank_1(t: SocketTransport, how: str) -> None:
    """Rank 0 waits for a message from rank 1: a posted receive (``python``) or the compiled
    tree's first round (``native``)."""
    if how == "python":
        t.irecv(torch.empty(8, dtype=torch.uint8), 1).wait()
    else:
        g = torch.randn(1000, generator=torch.Generator().manual_seed(0)).numpy()
        idx = np.sort(np.argsort(-np.abs(g), kind="stable")[:64]).astype(np.int64)
        native.Tree(t.fds(), 0, 64, 4, True)(idx, g[idx], transport.TIMEOUT_S)


HOW = [
    "python",
    pytest.param("native", marks=pytest.mark.skipif(native.why_unavailable() is not None, reason="no C++ compiler")),
]


def peer_closes(rank: int, P: int, how: str) -> str:
    t = SocketTransport()
    if rank == 1:
        t.close()
        dist.barrier()
        return ""
    dist.barrier()  # rank 1 has closed
    try:
        wait_on_rank_1(t, how)
    except ConnectionError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("how", HOW)
def test_a_peer_that_closes_is_named(how):
    assert "rank 1 closed its connection" in spawn(peer_closes, 2, (how,), timeout=300)[0]


def peer_hangs(rank: int, P: int, how: str) -> str:
    t = SocketTransport()
    transport.TIMEOUT_S = 1.0  # the job's collective_timeout_s, shortened
    out = ""
    if rank == 0:
        try:
            wait_on_rank_1(t, how)  # rank 1 never sends
        except TimeoutError as e:
            out = str(e)
    dist.barrier()
    return out


@pytest.mark.parametrize("how", HOW)
def test_a_peer_that_never_sends_times_out_naming_it(how):
    msg = spawn(peer_hangs, 2, (how,), timeout=300)[0]
    assert "timed out after 1 s" in msg and "rank(s) [1]" in msg


def both_transports(rank: int, P: int) -> list[bool]:
    out = []
    for m, density in ((3000, 0.01), (20_000, 0.05)):
        for algorithm in ("tree", "recursive_doubling"):
            for putback in ("index", "exact"):
                grads = [torch.randn(m, generator=torch.Generator().manual_seed(7 * s + rank)) for s in range(3)]
                got = {}
                for tr in ("socket", "backend"):
                    r = GTopKReducer(density, algorithm=algorithm, putback=putback, transport=tr)
                    got[tr] = [r.reduce(g.clone())[0] for g in grads] + [r.feedback.residual]
                out.append(all(torch.equal(a, b) for a, b in zip(got["socket"], got["backend"])))
    return out


@pytest.mark.parametrize("P", [3, 4])
def test_gtopk_over_sockets_is_gtopk_over_gloo_bit_for_bit(P):
    assert all(all(r) for r in spawn(both_transports, P, timeout=300))


def test_a_transport_setting_that_does_not_exist_is_refused():
    with pytest.raises(
        ValueError, match=r"reducer.transport=.tcp. is unknown; choose one of auto, native, socket, backend"
    ):
        GTopKReducer(0.01, transport="tcp")
