"""Memory of this process (Linux): its peak resident set per job, and what it costs at the end.

A worker process runs the jobs of one P one after another (``gtopk.run.pool``), so its
lifetime high-water mark (``VmHWM``, ``ru_maxrss``) would mix jobs: ``reset_peak_rss``
(at the start of a job) restarts it by writing ``5`` to ``/proc/self/clear_refs``, and
``peak_rss_mb`` reads it (every step's row: ``rss_peak_mb``). Where the reset is not
allowed (not Linux, or /proc read-only) the peak is the process's lifetime one, and
``reset_peak_rss`` says so by returning False. Before the reset, ``release_free_memory``
returns the heap an earlier job freed to the system (glibc's ``malloc_trim``), so that a
job's figures are its own.

RSS counts every resident page the process maps, the shared libraries that P ranks on one
host hold once among them too, so P x RSS overstates what P ranks need. ``rank_memory``
reads ``/proc/self/smaps_rollup`` once (it walks every mapping: at the end of a job, never
per step) and splits it: ``mem_private_mb`` (Private_Clean + Private_Dirty: pages no other
process maps), ``mem_pss_mb`` (proportional set size: each shared page divided among its
mappers), ``mem_rss_mb``; a host holds P ranks in about P x private + (RSS - private).

Local calls, not collective.
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys

#: where ``rank_memory`` reads (a module attribute so that a test can point it at a file)
SMAPS_ROLLUP = "/proc/self/smaps_rollup"


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the system: a garbage collection, then glibc's
    ``malloc_trim(0)`` (False where there is no glibc). A worker runs one job after another;
    memory an earlier job freed stays in this process's heap, resident and counted in its
    RSS and private pages, until trimmed."""
    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def reset_peak_rss() -> bool:
    """Restart this process's peak RSS from its current RSS, after ``release_free_memory``
    (so that an earlier job's freed heap is not counted); False where the restart is not
    possible."""
    release_free_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """This process's peak resident set size since the last reset (MiB): ``VmHWM`` of
    ``/proc/self/status``, else ``ru_maxrss`` (lifetime)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / (1024.0 * 1024.0) if sys.platform == "darwin" else kb / 1024.0


def parse_smaps_rollup(text: str) -> dict[str, float]:
    """``mem_private_mb``, ``mem_pss_mb`` and ``mem_rss_mb`` (MiB) of a ``smaps_rollup``
    text (lines ``Name:  <n> kB``); raises ValueError where a field it needs is missing."""
    kb: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) == 2 and fields[1] == "kB" and fields[0].isdigit():
            kb[name.strip()] = int(fields[0])
    need = ("Rss", "Pss", "Private_Clean", "Private_Dirty")
    missing = [n for n in need if n not in kb]
    if missing:
        raise ValueError(f"smaps_rollup lacks {', '.join(missing)}")
    return {
        "mem_private_mb": (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024.0,
        "mem_pss_mb": kb["Pss"] / 1024.0,
        "mem_rss_mb": kb["Rss"] / 1024.0,
    }


def rank_memory() -> dict[str, float]:
    """This process's memory now (``parse_smaps_rollup`` of ``SMAPS_ROLLUP``); empty where
    there is no such file (not Linux, or a kernel before 4.14): absent, never zero."""
    try:
        with open(SMAPS_ROLLUP) as f:
            text = f.read()
    except OSError:
        return {}
    try:
        return parse_smaps_rollup(text)
    except ValueError:
        return {}
