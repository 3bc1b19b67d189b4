"""Linux network namespaces through iproute2 (``ip``, ``tc``): create, enter, delete.

Names are ``gtk<owner pid>x<token>-<role>``, unique per job, so concurrent jobs never
collide; a namespace whose owner process is gone is stale and removed by ``sweep_stale``.
A reaper process (``python -m gtopk.run.cluster.reaper NAME...``), started in its own session,
waits for its parent to close a pipe and then removes the namespaces, so they disappear
even when the parent is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys

PREFIX = "gtk"
_NAME = re.compile(rf"^{PREFIX}(\d+)x[0-9a-f]+-")
CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed."""


@functools.cache
def unavailable_reason() -> str | None:
    """Why the emulated cluster's namespaces cannot be built here (one line), or None.

    Decided by trying, once per process: a throw-away namespace with a veth pair and a
    ``tbf`` qdisc on it (what ``gtopk.run.cluster.emulated`` builds), deleted at once. A
    root container without CAP_NET_ADMIN, a kernel without veth or tbf, or an iproute2
    that lacks them all fail here; the reason is the failing command and its error."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH (install iproute2)"
    reason = _try_build(f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}-probe")
    if reason and os.geteuid() != 0:
        reason += f" (this process runs as uid {os.geteuid()}, not root)"
    return reason


def _try_build(name: str) -> str | None:
    """Build namespace ``name`` with a shaped veth pair, then delete it; the first failing
    command and its error, or None. (A probe left behind by a kill is stale: its owner,
    this process, is gone, and ``sweep_stale`` removes it.)"""
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
        ["tc", "-n", name, "qdisc", "add", "dev", "v0", "root", "tbf", "rate", "1gbit", "burst", "32kb"]
        + ["latency", "10ms"],
    ]
    try:
        for cmd in steps:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"`{' '.join(cmd)}` could not run: {e}"
            if proc.returncode != 0:
                error = " ".join((proc.stderr.strip() or proc.stdout.strip()).split()) or f"exit {proc.returncode}"
                return f"`{' '.join(cmd)}` failed: {error}"
        return None
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=60)


def run_batch(tool: str, commands: list[str], namespace: str | None = None) -> None:
    """Run ``commands`` through ``<tool> [-n namespace] -batch -`` (one process)."""
    if not commands:
        return
    where = ["-n", namespace] if namespace else []
    proc = subprocess.run(
        [tool, *where, "-batch", "-"], input="\n".join(commands) + "\n", capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise NetnsError(f"`{tool} -batch` failed: {proc.stderr.strip() or proc.stdout.strip()}")


def existing() -> list[str]:
    """Names of all namespaces this package created (any owner)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def pids_in(name: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def delete(names: list[str]) -> None:
    """Kill whatever still runs inside ``names``, then delete them (missing ones ignored).
    Deleting a namespace removes its veth ends, and with them their peers."""
    present = set(existing())
    for name in names:
        if name not in present:
            continue
        for pid in pids_in(name):
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete namespaces whose owner process no longer exists; returns their names."""
    stale = [n for n in existing() if (m := _NAME.match(n)) and not _alive(int(m.group(1)))]
    delete(stale)
    return stale


def enter(name: str) -> None:
    """Move the calling thread (call it from the main thread before starting any other)
    into namespace ``name``; threads started afterwards inherit it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def start_reaper(names: list[str]) -> subprocess.Popen:
    """A process that deletes ``names`` once our end of its stdin pipe closes (we exit,
    however that happens). It ignores Ctrl-C and lives in its own session."""
    return subprocess.Popen(
        [sys.executable, "-m", "gtopk.run.cluster.reaper", *names], stdin=subprocess.PIPE, start_new_session=True
    )
