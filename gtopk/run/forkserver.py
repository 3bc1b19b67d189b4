"""How the worker group starts its processes: forked from a fork server that has imported
torch (``forkserver``, where the platform has it: Linux), or ``spawn`` (a fresh interpreter
per worker; the fallback elsewhere, and on request).

Why: ``import torch`` and ``torch._dynamo`` (which ``torch.optim.SGD``'s constructor
imports) are about 360 MiB of a rank's private memory when every rank imports them itself
(docs/cluster.md, "Memory per rank"); forked from one process that imported them, the ranks
share those pages.

multiprocessing starts one fork server per launcher process, on the first worker it asks
for, and keeps it for the launcher's life (``PRELOAD`` is imported there once). The server
is a copy of the launcher *at that moment*; what a spawned worker would take from the
launcher when it starts, a forked one is handed explicitly (``Handover``): the whole
environment (applied before the worker imports or reads anything else: NCCL_*, GLOO_*,
CUDA_VISIBLE_DEVICES, the cluster's settings, whatever was set after the server started),
its stdout and stderr, its CPU affinity and its niceness. Variables that torch and its
libraries read when they are *imported* (``IMPORT_TIME``: OpenMP, MKL, TORCH_*, the loader)
cannot be handed over that late: a group whose values of those differ from the server's is
spawned instead (``context``). Nothing here is collective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import multiprocessing.forkserver as mp_forkserver
import os
import re
import sys
import threading
from multiprocessing import reduction
from typing import Any

#: the start methods a worker group knows
METHODS = ("forkserver", "spawn")
#: what the fork server imports once: torch, what the optimizer's constructor imports, and
#: the workers' entry modules (a name that does not import is skipped by multiprocessing),
#: then ``gtopk.run.preloaded``
PRELOAD = (
    "torch",
    "torch._dynamo",
    "gtopk.run.pool",
    "gtopk.train.loop",
    "gtopk.simulated.ranks",
    "gtopk.run.preloaded",  # last: freezes what the others imported (gc.freeze)
)
#: environment variables read when torch's native libraries or the interpreter are loaded,
#: not when used. Not TORCH*/PYTORCH*: torch reads those when a feature starts (after the
#: hand-over), and sets some itself on import (``TORCHINDUCTOR_CACHE_DIR`` by torch._dynamo):
#: matching them made a launcher that imported torch._dynamo after the server started spawn
#: every later group (ResNet-20 ranks of a Fig. 6 sweep held 506 MiB of their own, not 39)
IMPORT_TIME = re.compile(r"^(OMP_|GOMP_|KMP_|MKL_|OPENBLAS_|LD_|MALLOC_|GLIBC_TUNABLES$|PYTHONHASHSEED$|PYTHONMALLOC$)")

_lock = threading.Lock()
_server: tuple[int, dict[str, str]] | None = None  # (pid, import-time environment) of the server we saw start


#: the environment variable that names the start method of groups that do not say
#: (``GTOPK_START_METHOD=spawn``: every group spawned)
METHOD_ENV = "GTOPK_START_METHOD"


def default_method() -> str:
    """``METHOD_ENV`` if set, else ``forkserver`` (``spawn`` where the platform has no fork server)."""
    return os.environ.get(METHOD_ENV) or "forkserver"


def expected_method() -> str:
    """The start method a group asking for none would use here (``default_method``, or
    ``spawn`` where the platform has no fork server); a group may still be spawned when its
    import-time environment differs from the server's (``context``)."""
    method = default_method()
    return method if method != "forkserver" or "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def import_time_env(environ: Any) -> dict[str, str]:
    return {k: v for k, v in environ.items() if IMPORT_TIME.match(k)}


def context(method: str | None) -> tuple[Any, int, str]:
    """``(multiprocessing context, the workers' parent pid, the method used)`` for a group
    started now with ``method`` (None: ``default_method()``). For ``forkserver`` the server
    is started here if it is not running (with ``PRELOAD``); the workers' parent is the
    server. ``spawn`` is used instead where the platform has no fork server, or where the
    import-time environment (``IMPORT_TIME``) differs from the server's."""
    method = method or default_method()
    if method not in METHODS:
        raise ValueError(f"start_method={method!r} is unknown ({METHOD_ENV}?); choose one of {', '.join(METHODS)}")
    if method == "forkserver" and "forkserver" in multiprocessing.get_all_start_methods():
        global _server
        server = mp_forkserver._forkserver
        with _lock:
            if server._forkserver_pid is None:
                server.set_forkserver_preload(list(PRELOAD))
            server.ensure_running()
            pid = server._forkserver_pid
            if _server is None or _server[0] != pid:  # (re)started now: it has this environment
                _server = (pid, import_time_env(os.environ))
            now = import_time_env(os.environ)
            if now == _server[1]:
                return multiprocessing.get_context("forkserver"), pid, "forkserver"
            changed = sorted(k for k in now.keys() | _server[1].keys() if now.get(k) != _server[1].get(k))
            print(
                f"note: workers spawned, not forked from the fork server: {', '.join(changed)} changed since it "
                "started (read when torch loads); a rank then holds its own copy of torch (docs/cluster.md)",
                file=sys.stderr,
            )
    return multiprocessing.get_context("spawn"), os.getpid(), "spawn"


class _Fd:
    """A file descriptor that travels to the started process (pickled only while
    multiprocessing starts one: ``reduction.DupFd``), rebuilt there as a descriptor number."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self) -> tuple:
        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return dup.detach()


@dataclasses.dataclass(frozen=True)
class Handover:
    """What a forked worker takes from its launcher as a spawned one would (picklable:
    built in the launcher as the group starts, applied first thing in the worker)."""

    environ: dict[str, str]
    stdio: tuple[tuple[int, Any], ...]  # (1 or 2, the launcher's descriptor)
    affinity: frozenset[int] | None
    nice: int | None

    @classmethod
    def now(cls) -> Handover:
        stdio = []
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                os.fstat(fd)
                stdio.append((fd, _Fd(fd)))
        affinity = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        nice = os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else None
        return cls(dict(os.environ), tuple(stdio), affinity, nice)

    def apply(self) -> None:
        """In the worker: the launcher's environment, stdout/stderr, CPU affinity and
        niceness (raised only: lowering it takes a privilege the launcher may lack)."""
        os.environ.clear()
        os.environ.update(self.environ)  # putenv: C code (gloo, NCCL, CUDA) reads it too
        for target, fd in self.stdio:
            if isinstance(fd, int) and fd != target:
                os.dup2(fd, target)
                os.close(fd)
        if self.affinity is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.affinity)
        if self.nice is not None:
            with contextlib.suppress(OSError):
                now = os.getpriority(os.PRIO_PROCESS, 0)
                if self.nice > now:
                    os.setpriority(os.PRIO_PROCESS, 0, self.nice)


def leave_server() -> None:
    """In a forked worker: close its copy of the launcher's end of the server's "alive"
    pipe. multiprocessing gives every forked child one, and the server exits only once
    every copy is closed; a worker that kept it would keep the server, hence itself (its
    parent-death signal fires when the server exits), alive after the launcher died.
    The worker's own processes (DataLoader workers) are spawned, as a spawned rank's are:
    forked from a server of the rank's own, they would hold that server's pipe in turn and
    outlive a rank that is SIGKILLed."""
    server = mp_forkserver._forkserver
    fd, server._forkserver_alive_fd = server._forkserver_alive_fd, None
    if fd is not None and server._forkserver_pid is None:  # inherited, not a server of our own
        with contextlib.suppress(OSError):
            os.close(fd)
    multiprocessing.set_start_method("spawn", force=True)
