"""CPU caps for time dilation: one cgroup per rank whose processes may use at most a
fraction of a CPU (CFS bandwidth control), so that a rank of a dilated cluster gets its
virtual processor and no more.

Under time dilation D (``gtopk.run.cluster.emulated``) a rank with T intra-op threads
should compute as fast, in virtual time, as on T cores of its own: T / D cores of wall
time. Sharing the cores gives it that much only while every rank computes at once; a
rank computing alone would get a whole core, and its CPU work would look D times too fast.
The cap makes the share a ceiling: quota T x 5 ms of CPU per period of D x 5 ms, on cgroup
v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` of the ``cpu`` controller) or v2
(``cpu.max``, the ``cpu`` controller enabled at the root). A high weight (``cpu.shares``
100 times a task's, v2 ``cpu.weight`` 10000) makes it a floor too: a capped rank gets its
share before the machine's other processes (whose sessions would otherwise each get an
equal share, ``sched_autogroup``). The caps of a job add up to at most the cores, so it
never takes them all. CPU bursts shorter than the quota run at full speed (the kernel's
least quota is 1 ms, where its throttling costs much more: docs/cluster.md); ``gtopk.host``
paces those against the clock.

Groups are directories named like the job's namespaces (``gtk<owner pid>x<token>-r<rank>``,
``gtopk.run.cluster.netns``), directly under the controller's root; ``netns.delete`` and
``netns.sweep_stale`` remove them with the namespaces of the same names. A worker moves
itself in (``join``) before it starts its process group. Needs root.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import time
from pathlib import Path

#: CFS quota per thread of a rank (microseconds; the period is D times this); a period is at most 1 s
QUOTA_US, MAX_PERIOD_US = 5000, 1_000_000
#: a capped group's weight: 100 times a task's (v1 ``cpu.shares``, default 1024; v2 ``cpu.weight``, default 100)
WEIGHT = {1: ("cpu.shares", "102400"), 2: ("cpu.weight", "10000")}


class CapError(RuntimeError):
    """A cgroup could not be made or joined (one line)."""


@functools.cache
def _controller() -> tuple[Path, int] | str:
    """(root of the CPU controller's hierarchy, cgroup version), or why there is none."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError as e:
        return f"cannot read /proc/self/mounts ({e.strerror})"
    fields = [line.split() for line in mounts]
    for f in fields:  # v1: the cpu controller has a hierarchy of its own (cpu or cpu,cpuacct)
        if len(f) >= 4 and f[2] == "cgroup" and "cpu" in f[3].split(","):
            return Path(f[1]), 1
    for f in fields:  # v2: the unified hierarchy, with cpu enabled for the root's children
        if len(f) >= 3 and f[2] == "cgroup2":
            try:
                enabled = (Path(f[1]) / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "cpu" in enabled:
                return Path(f[1]), 2
    return "no cgroup CPU controller (cgroup v1 'cpu', or v2 with cpu in the root's cgroup.subtree_control)"


def root() -> Path:
    """Where this package's groups live (CapError where there is no CPU controller)."""
    found = _controller()
    if isinstance(found, str):
        raise CapError(found)
    return found[0]


def quota(threads: int, dilation: int) -> tuple[int, int]:
    """(quota, period) in microseconds for ``threads`` / ``dilation`` CPUs: ``threads`` x
    ``QUOTA_US`` per ``dilation`` x ``QUOTA_US`` (ValueError past the kernel's 1 s period)."""
    if not (isinstance(threads, int) and isinstance(dilation, int) and threads >= 1 and dilation >= 1):
        raise ValueError(f"threads={threads!r} and dilation={dilation!r} must be integers >= 1")
    period = dilation * QUOTA_US
    if period > MAX_PERIOD_US:
        raise ValueError(f"dilation={dilation} gives a CFS period of {period} us, above the kernel's 1 s")
    return threads * QUOTA_US, period


def cap(name: str, threads: int, dilation: int) -> str:
    """Make group ``name`` capped at ``threads`` / ``dilation`` CPUs, of weight ``WEIGHT``;
    returns its path."""
    q, period = quota(threads, dilation)
    found = _controller()
    if isinstance(found, str):
        raise CapError(found)
    path, version = found[0] / name, found[1]
    try:
        path.mkdir()
        if version == 1:
            (path / "cpu.cfs_period_us").write_text(str(period))
            (path / "cpu.cfs_quota_us").write_text(str(q))
        else:
            (path / "cpu.max").write_text(f"{q} {period}")
        (path / WEIGHT[version][0]).write_text(WEIGHT[version][1])
    except OSError as e:
        with contextlib.suppress(OSError):
            path.rmdir()
        raise CapError(f"cannot make the CPU-capped cgroup {path}: {e.strerror or e}") from None
    return str(path)


def join(path: str) -> None:
    """Move the calling process (all its threads) into the group at ``path``."""
    try:
        Path(path, "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        raise CapError(f"cannot join the CPU-capped cgroup {path}: {e.strerror or e}") from None


def members(path: Path) -> list[int]:
    """The processes in the group at ``path`` (none when it is gone)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def existing(prefix: str) -> list[str]:
    """Names of the groups under ``root()`` that start with ``prefix`` (none without a controller)."""
    found = _controller()
    if isinstance(found, str):
        return []
    try:
        return sorted(p.name for p in found[0].iterdir() if p.is_dir() and p.name.startswith(prefix))
    except OSError:
        return []


def remove(names: list[str], wait_s: float = 30.0) -> None:
    """Remove the groups ``names`` (missing ones ignored): whatever still runs in one is
    killed (a job's own ranks), and the group removed once the kernel has let go of it
    (polled, up to ``wait_s``)."""
    found = _controller()
    if isinstance(found, str):
        return
    for name in names:
        path = found[0] / name
        if not path.is_dir():
            continue
        deadline = time.monotonic() + wait_s
        while True:
            for pid in members(path):
                if pid != os.getpid():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # busy: its processes are still exiting
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)


@functools.cache
def unavailable_reason(prefix: str) -> str | None:
    """Why ranks cannot be CPU-capped here (one line), or None. Decided by trying, once per
    process: a group capped at half a CPU, joined by nobody, removed at once; its name is
    ``<prefix><pid>x<token>-cpuprobe`` (``netns.PREFIX``: a stale one is swept with the rest)."""
    name = f"{prefix}{os.getpid()}x{secrets.token_hex(3)}-cpuprobe"
    try:
        cap(name, 1, 2)
    except CapError as e:
        return str(e) + ("" if os.geteuid() == 0 else f" (this process runs as uid {os.geteuid()}, not root)")
    finally:
        remove([name])
    return None
