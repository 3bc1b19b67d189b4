"""Plain TCP sockets for the sparse reducers' own point-to-point rounds on the CPU.

gloo's TCP pairs send a message only once its receiver has posted the receive (a notice
crosses first), hand every message to a network thread, and cost 30-50 us to post from
Python: on a few-kB message of gTop-k's rounds that is most of the time. A
``SocketTransport`` carries the same messages (the same bytes: ``gtopk.reducers.wire``'s
format) over one TCP connection per pair of ranks, written and read by the calling thread
itself: a send goes into the kernel's buffer at once (the receiver need not have posted),
and a receive reads the bytes where they wait. Ranks are group ranks.

**Progress.** Sends and receives are non-blocking system calls; whenever a call cannot go
on, ``_progress`` reads every posted receive whose bytes have arrived, writes what the
kernel takes, and otherwise waits in ``select`` for any of them. So a schedule that works
over gloo (every receive posted before the send it waits behind, as ``PointToPoint``'s
``exchange`` and Ok-Topk's rotation do) cannot deadlock on full socket buffers here.

**Failures.** A peer that exits closes its connections: a receive or send to it raises
``ConnectionError`` naming it. A peer that hangs: after ``TIMEOUT_S`` without progress
(the job's ``collective_timeout_s``, set by ``gtopk.run.world.set_collective_timeout``) the
call raises ``TimeoutError`` ("timed out", naming the ranks waited for), which the job's
supervisor reports as it does a gloo timeout.

**Addresses.** Each rank listens on the address of ``GLOO_SOCKET_IFNAME`` when set (the
emulated cluster's shaped ``eth0``, so the rounds cross the same link as gloo's), else the
address it routes to ``MASTER_ADDR`` from; the ranks swap addresses with one
``all_gather_object`` and connect every pair up front (``connect``, collective).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import weakref
from collections import deque

import torch.distributed as dist
from torch import Tensor

from gtopk.host import interface_address

#: seconds a call waits without any progress before it raises (the job's collective timeout)
TIMEOUT_S = 300.0
_FLAGS = socket.MSG_DONTWAIT


#: the settings of a reducer's ``transport`` (``SparseReducer.p2p_transport``)
TRANSPORTS = ("auto", "native", "socket", "backend")


def backend_of(group: dist.ProcessGroup | None) -> str:
    """Local. The group's backend (``dist.get_backend``)."""
    return dist.get_backend(group)


def uses_sockets(setting: str, group: dist.ProcessGroup | None) -> bool:
    """Local. Whether a reducer's rounds of CPU tensors take a ``SocketTransport``:
    ``socket`` and ``native`` (its compiled rounds, ``gtopk.reducers.native``) yes, ``backend``
    no, ``auto`` on a gloo group."""
    return setting in ("socket", "native") or (setting == "auto" and backend_of(group) == "gloo")


def local_address() -> str:
    """Local. Where this rank listens: ``GLOO_SOCKET_IFNAME``'s address, else the source
    address of this host's route to ``MASTER_ADDR`` (127.0.0.1 without one)."""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    if ifname:
        return interface_address(ifname)
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(master), 9))  # no packet: picks the route
        return s.getsockname()[0]


class _Message:
    """A posted send or receive of one message: ``wait`` returns once every byte of ``buf``
    is in the kernel (a send) or has arrived in ``buf`` (a receive)."""

    __slots__ = ("transport", "peer", "view", "got")

    def __init__(self, transport: SocketTransport, peer: int, buf: Tensor):
        self.transport, self.peer, self.view, self.got = transport, peer, memoryview(buf.numpy()).cast("B"), 0

    def done(self) -> bool:
        return self.got == len(self.view)

    def wait(self) -> None:
        self.transport._progress(self)


class SocketTransport:
    """One TCP connection to each other rank of a group, for messages of CPU tensors.

    Collective: the constructor (every rank of ``group`` builds one, at the same point).
    ``isend``/``irecv`` are the halves of matched pairs, as ``dist.isend``/``dist.irecv``:
    messages between two ranks arrive in the order they were sent, and a receive must be
    as long as its message."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((local_address(), 0))
        listener.listen(self.world)
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, listener.getsockname(), group=group)
        self.peers: dict[int, socket.socket] = {}
        try:
            for peer in range(self.rank):  # connect to the lower ranks; they accept
                s = socket.create_connection(tuple(everyone[peer]), timeout=TIMEOUT_S)
                s.sendall(struct.pack("!i", self.rank))
                self.peers[peer] = s
            listener.settimeout(TIMEOUT_S)
            while len(self.peers) < self.world - 1:
                s, _ = listener.accept()
                s.settimeout(TIMEOUT_S)
                self.peers[struct.unpack("!i", _read_exactly(s, 4))[0]] = s
        except OSError as e:
            self.close()
            raise ConnectionError(f"rank {self.rank}: connecting the sparse rounds' sockets failed: {e}") from e
        finally:
            listener.close()
        for s in self.peers.values():
            s.settimeout(None)  # blocking; every data call passes MSG_DONTWAIT
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._fd = {s.fileno(): p for p, s in self.peers.items()}
        self._recvs: dict[int, deque[_Message]] = {p: deque() for p in self.peers}
        self._sends: dict[int, deque[_Message]] = {p: deque() for p in self.peers}
        self._finalizer = weakref.finalize(self, _close_all, list(self.peers.values()))

    def fds(self) -> list[int]:
        """Local. The connections' file descriptors by rank (-1 at this rank's own place), for
        compiled rounds that use them directly (``gtopk.reducers.native``): nothing may be
        posted here meanwhile."""
        return [self.peers[p].fileno() if p in self.peers else -1 for p in range(self.world)]

    def idle(self) -> bool:
        """Local. Whether no posted message is waiting (the sockets may be handed over)."""
        return not any(self._recvs.values()) and not any(self._sends.values())

    def close(self) -> None:
        """Local. Close every connection (also when the transport is garbage-collected)."""
        _close_all(list(self.peers.values()))

    def irecv(self, buf: Tensor, src: int) -> _Message:
        """Post a receive of ``buf``'s bytes from ``src`` (nothing is called on the socket)."""
        r = _Message(self, src, buf)
        self._recvs[src].append(r)
        return r

    def isend(self, buf: Tensor, dst: int) -> _Message:
        """Post a send of ``buf``'s bytes (contiguous, CPU) to ``dst``: written at once as far
        as the kernel takes them; ``wait`` writes the rest."""
        s = _Message(self, dst, buf)
        q = self._sends[dst]
        q.append(s)
        if len(q) == 1:
            self._write(dst)
        return s

    # -- progress ----------------------------------------------------------------------
    def _read(self, peer: int) -> bool:
        """Read what has arrived from ``peer`` into its posted receives; True if any byte."""
        q, moved = self._recvs[peer], False
        while q:
            r = q[0]
            try:
                n = self.peers[peer].recv_into(r.view[r.got :], 0, _FLAGS)
            except BlockingIOError:
                return moved
            except OSError as e:
                raise self._lost(peer, e) from e
            if n == 0:
                raise self._lost(peer, None)
            r.got += n
            moved = True
            if not r.done():
                return moved
            q.popleft()
        return moved

    def _write(self, peer: int) -> bool:
        """Write what the kernel takes of the sends posted to ``peer``; True if any byte."""
        q, moved = self._sends[peer], False
        while q:
            s = q[0]
            try:
                n = self.peers[peer].send(s.view[s.got :], _FLAGS)
            except BlockingIOError:
                return moved
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    return moved
                raise self._lost(peer, e) from e
            s.got += n
            moved = True
            if not s.done():
                return moved
            q.popleft()
        return moved

    def _progress(self, call: _Message) -> None:
        """Move every posted message along until ``call`` is done; raise if nothing moves for
        ``TIMEOUT_S``."""
        while not call.done():
            moved = False
            for p, q in self._recvs.items():
                if q:
                    moved |= self._read(p)
            for p, q in self._sends.items():
                if q:
                    moved |= self._write(p)
            if moved or call.done():
                continue
            readers = [self.peers[p] for p, q in self._recvs.items() if q]
            writers = [self.peers[p] for p, q in self._sends.items() if q]
            ready = select.select(readers, writers, [], TIMEOUT_S)
            if not any(ready):
                waiting = sorted({p for p, q in self._recvs.items() if q} | {p for p, q in self._sends.items() if q})
                raise TimeoutError(
                    f"rank {self.rank}: the sparse rounds' sockets timed out after {TIMEOUT_S:g} s waiting for "
                    f"rank(s) {waiting}"
                )

    def _lost(self, peer: int, err: OSError | None) -> ConnectionError:
        why = f": {err}" if err else ""
        return ConnectionError(f"rank {self.rank}: rank {peer} closed its connection of the sparse rounds{why}")


def _read_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection during the handshake")
        data += chunk
    return data


def _close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass
