"""Peak resident memory of this process (Linux), per job.

A worker process runs the jobs of one P one after another (``gtopk.run.group``), so its
lifetime high-water mark (``VmHWM``, ``ru_maxrss``) would mix jobs: ``reset_peak_rss``
(at the start of a job) restarts it by writing ``5`` to ``/proc/self/clear_refs``, and
``peak_rss_mb`` reads it. Where the reset is not allowed (not Linux, or /proc read-only)
the peak is the process's lifetime one, and ``reset_peak_rss`` says so by returning False.
Local calls, not collective.
"""

from __future__ import annotations

import resource
import sys


def reset_peak_rss() -> bool:
    """Restart this process's peak RSS from its current RSS; False where that is not possible."""
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
