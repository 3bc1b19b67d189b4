"""Linux network namespaces through iproute2 (``ip``, ``tc``): create, enter, delete.

Names are ``gtk<owner pid>x<token>-<role>``, unique per job, so concurrent jobs never
collide; a namespace whose owner process is gone is stale and removed by ``sweep_stale``.
A rank's CPU-capped cgroup under time dilation (``gtopk.run.cluster.cpucap``) has its
namespace's name and goes with it (``delete``, ``sweep_stale``).
A reaper process (``python -m gtopk.run.cluster.reaper NAME...``), started in its own session,
waits for its parent to close a pipe and then removes the namespaces, so they disappear
even when the parent is SIGKILLed.

Commands reach ``ip``/``tc`` as batch input run as root, so no text of a setting goes into
them: ``parse_rate``, ``parse_size``, ``parse_time`` and ``parse_count`` turn a setting
into a whole number (bits/s, bytes, microseconds) with strict patterns (digits, an optional
fraction, a known unit; no sign, exponent, space, NaN or inf), and ``tc_rate``,
``tc_size`` and ``tc_time`` write that number back in tc's units. ``run_batch`` refuses a
command that is not one printable line.
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
from fractions import Fraction

from gtopk.run.cluster import cpucap
from gtopk.run.supervise import alive

PREFIX = "gtk"
_NAME = re.compile(rf"^{PREFIX}(\d+)x[0-9a-f]+-")
#: a job's name (``<PREFIX><owner pid>x<hex token>``), the stem of its namespaces' names
JOB = re.compile(rf"{PREFIX}[0-9]+x[0-9a-f]+", re.ASCII)
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


# --------------------------------------------------------------- tc's units (iproute2 tc_util.c)
_NUMBER = r"(?P<number>[0-9]+(?:\.[0-9]+)?)"  # no sign, exponent, space, NaN or inf
#: rate units, bits/s (tc's get_rate; case-insensitive there too)
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
RATE_UNITS |= {"kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40}
RATE_UNITS |= {"bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12}
RATE_UNITS |= {"kibps": 8 * 2**10, "mibps": 8 * 2**20, "gibps": 8 * 2**30, "tibps": 8 * 2**40}
#: size units, bytes (tc's get_size: binary prefixes; ``kbit`` is 1024 bits); none: bytes
SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}
SIZE_UNITS |= {"kbit": 2**10 // 8, "mbit": 2**20 // 8, "gbit": 2**30 // 8}
#: time units, microseconds (tc's get_time; a bare number, microseconds there, is refused here)
TIME_UNITS = {u: 10**6 for u in ("s", "sec", "secs")}
TIME_UNITS |= {u: 10**3 for u in ("ms", "msec", "msecs")} | {u: 1 for u in ("us", "usec", "usecs")}
U32 = 2**32 - 1


def _text(value: object) -> str | None:
    """A setting as the text to match: str as it is, int and float as Python writes them
    (``nan``, ``inf`` and ``1e+20`` then fail the patterns); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return repr(value)
    return value if isinstance(value, str) else None


def _whole(value: object, units: dict[str, int], what: str) -> int:
    """``value`` (number + unit of ``units``) as a whole number of the units' base; ValueError
    (a short reason) when it does not match, is not whole, or is not positive."""
    text = _text(value)
    m = re.fullmatch(_NUMBER + r"(?P<unit>[a-zA-Z]*)", text or "", re.ASCII)
    if m is None or m.group("unit").lower() not in units:
        raise ValueError(f"is not {what}")
    amount = Fraction(m.group("number")) * units[m.group("unit").lower()]  # exact
    if amount.denominator != 1:
        raise ValueError(f"is not {what} (not a whole number of its smallest unit)")
    if amount <= 0:
        raise ValueError(f"is not {what} (it must be above 0)")
    return int(amount)


def parse_rate(value: object) -> int:
    """A tc rate (``1gbit``, ``100mbit``, ``125mbps`` = bytes/s) in bits/s: a unit is
    required, and the rate must be whole bytes/s (as tc stores it)."""
    bits = _whole(value, RATE_UNITS, "a tc rate with a unit (bit, kbit, mbit, gbit, bps, ...)")
    if bits % 8 or bits // 8 >= 2**64:
        raise ValueError("is not a whole number of bytes per second below 2^64")
    return bits


def parse_size(value: object) -> int:
    """A tc size (``32kb`` = 32768, ``1500``, ``2mb``) in bytes, at most 2^32 - 1."""
    size = _whole(value, SIZE_UNITS, "a tc size in bytes (a whole number with an optional unit b, kb, mb, gb)")
    if size > U32:
        raise ValueError("is larger than 2^32 - 1 bytes")
    return size


def parse_time(value: object) -> int:
    """A tc time (``10ms``, ``500us``, ``1s``) in whole microseconds, at most 2^32 - 1."""
    us = _whole(value, TIME_UNITS, "a tc time with a unit (s, ms, us)")
    if us > U32:
        raise ValueError("is longer than 2^32 - 1 microseconds")
    return us


def parse_count(value: object, low: int, high: int) -> int:
    """A whole number (int, or its decimal digits) in ``[low, high]``, no unit."""
    text = _text(value)
    if text is None or not re.fullmatch(r"[0-9]+", text, re.ASCII):
        raise ValueError("is not a whole number")
    n = int(text)
    if not low <= n <= high:
        raise ValueError(f"is outside {low} .. {high}")
    return n


def _largest(n: int, units: list[tuple[str, int]]) -> str:
    """``n`` in the largest of ``units`` (descending; the last has scale 1) that divides it."""
    unit, scale = next((u, s) for u, s in units if n % s == 0)
    return f"{n // scale}{unit}"


def tc_rate(bits_per_s: int) -> str:
    """bits/s in tc's decimal rate units: 10**9 -> ``1gbit``, 10**8 -> ``100mbit``."""
    return _largest(bits_per_s, [("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3), ("bit", 1)])


def tc_size(size: int) -> str:
    """bytes in tc's binary size units: 32768 -> ``32kb``, 1500 -> ``1500b``."""
    return _largest(size, [("mb", 2**20), ("kb", 2**10), ("b", 1)])


def tc_time(us: int) -> str:
    """microseconds in tc's time units: 10000 -> ``10ms``, 1500 -> ``1500us``."""
    return _largest(us, [("s", 10**6), ("ms", 10**3), ("us", 1)])


def run_batch(tool: str, commands: list[str], namespace: str | None = None) -> None:
    """Run ``commands`` through ``<tool> [-n namespace] -batch -`` (one process). Each
    command must be one line of printable ASCII (ValueError otherwise: a bug, since every
    command is written from parsed numbers and generated names)."""
    if not commands:
        return
    for c in commands:
        if not re.fullmatch(r"[ -~]+", c, re.ASCII):
            raise ValueError(f"refusing `{tool} -batch` input that is not one printable line: {c!r}")
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
    """Kill whatever still runs inside ``names``, then delete them (missing ones ignored),
    and the CPU-capped cgroups of the same names (time dilation, ``cpucap``). Deleting a
    namespace removes its veth ends, and with them their peers."""
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
    cpucap.remove(names)


def sweep_stale() -> list[str]:
    """Delete namespaces and CPU-capped cgroups whose owner process no longer exists;
    returns their names."""
    names = sorted(set(existing()) | set(cpucap.existing(PREFIX)))
    stale = [n for n in names if (m := _NAME.match(n)) and not alive(int(m.group(1)))]
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
