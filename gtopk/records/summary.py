"""What ``summary.json`` holds: the job's medians over its post-warm-up iterations
(``summarize``), how its times were obtained (``time_base``: real, or dilated by the
emulated cluster's time dilation), the environment it ran in (``environment``: versions,
device, CPU/GPU, git commit) and, for training, the coverage and top-1 trend
(``gtopk.records.regime``)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from gtopk.records.regime import summary_fields

TIMINGS = ("t_data", "t_compute", "t_compr", "t_commu", "t_update", "t_iter")
COUNTS = ("bytes_sent", "bytes_recv")  # a row lacking these or TIMINGS (a damaged record) is left out


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).resolve().parent, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


#: ``summary.json``'s ``backend`` of a ``cluster=simulated`` run (no torch.distributed backend: its P
#: ranks are one process; ``gtopk.simulated.ranks`` writes it, ``analysis.training`` reads it)
SIMULATED_BACKEND = "in-process"


def package_version(name: str) -> str | None:
    """``name.__version__`` without importing ``name`` where it is not imported yet (torchvision:
    87 MB per process, which a replayed benchmark's worker never needs): read from its
    ``version.py`` as the package writes it (``0.29.2+cu132``), else its distribution's."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__version__", None)
    spec = importlib.util.find_spec(name)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        with contextlib.suppress(OSError):
            found = re.search(
                r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", (Path(folder) / "version.py").read_text(), re.M
            )
            if found:
                return found.group(1)
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: str, backend: str) -> dict:
    import hydra

    import gtopk

    env = {
        "gtopk": gtopk.__version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": package_version("torchvision"),
        "hydra": hydra.__version__,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "backend": backend,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), env["cpu"])
    except OSError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return env


def time_base(rows: Iterable[dict]) -> dict:
    """How the rows' times were obtained (their ``dilation``, ``gtopk.host``): ``time_base`` ``real``
    (wall seconds) or ``dilated`` (wall seconds / ``dilation``, the emulated cluster's time
    dilation); rows without ``dilation`` (older runs, ``cluster=simulated``) are real."""
    found = sorted({int(r.get("dilation", 1)) for r in rows})
    if len(found) > 1:  # attempts of one job under different dilations
        return {"time_base": "mixed", "dilation": found}
    d = found[0] if found else 1
    return {"time_base": "dilated" if d > 1 else "real", "dilation": d}


def memory_fields(rows: Iterable[dict]) -> dict:
    """What the rank with the most private memory at the end of the job held (MiB; its last
    row's ``mem_*``, ``gtopk.train.memory.rank_memory``): ``mem_private_mb`` (its own pages),
    ``mem_shared_mb`` (RSS - private: pages it shares, with the other ranks of the host
    among others) and ``mem_pss_mb``; a host holds P such ranks in about P x private +
    shared. None of the keys where no row has them (no /proc, older runs). A simulated
    job's ranks are one process: its figures are that process's."""
    found = [r for r in rows if "mem_private_mb" in r]
    if not found:
        return {}
    top = max(found, key=lambda r: r["mem_private_mb"])
    return {
        "mem_private_mb": top["mem_private_mb"],
        "mem_shared_mb": top["mem_rss_mb"] - top["mem_private_mb"],
        "mem_pss_mb": top["mem_pss_mb"],
    }


def summarizable(row: dict) -> bool:
    """Whether a step's row holds what the summary's medians read (a damaged one may not)."""
    return all(row.get(k) is not None for k in (*TIMINGS, *COUNTS))


def summarize(rows: Iterable[dict], meta: dict, images_per_iter: int, epochs: Iterable[dict] | None = None) -> dict:
    """Medians over post-warm-up iterations of all ranks (iterations where rank 0 is
    slowest and where it is fastest both count); steps skipped for a non-finite gradient
    are counted (iterations), not timed. Training runs (``meta["mode"]``) also carry the
    coverage of all their iterations and, given the ``epochs`` rows, the trend of the test
    top-1 at the end (``gtopk.records.regime.summary_fields``)."""
    rows = list(rows)
    memory = memory_fields(rows)  # from every row: the last may be a skipped step's
    regime = summary_fields(rows, meta["params"], epochs) if meta.get("mode") == "train" else {}
    rows = [r for r in rows if not r.get("warmup")]
    skipped = len({r.get("iter") for r in rows if r.get("nonfinite")})
    rows = [r for r in rows if not r.get("nonfinite") and summarizable(r)]
    if not rows:
        raise ValueError("no post-warm-up iterations were recorded; raise benchmark.iters")
    med = {k: statistics.median(r[k] for r in rows) for k in TIMINGS}
    out = dict(meta)
    out.update(med)
    out["iterations"] = len(rows)
    out["steps_skipped_nonfinite"] = skipped
    out["images_per_s_per_worker"] = images_per_iter / med["t_iter"]
    out["bytes_sent_per_iter"] = statistics.median(r["bytes_sent"] for r in rows)
    out["bytes_recv_per_iter"] = statistics.median(r["bytes_recv"] for r in rows)
    payload = [r["payload_bytes"] for r in rows if r.get("payload_bytes") is not None]
    out["payload_bytes_per_iter"] = statistics.median(payload) if payload else None  # DDP and its hook baselines
    # t_commu of the rank that entered each step's collective last (it waited for no
    # other rank's compute or selection): the collective's own time, skew excluded
    by_iter: dict = {}
    for r in rows:
        by_iter.setdefault(r.get("iter"), []).append(r["t_commu"])
    out["t_commu_last_arrival"] = statistics.median(min(v) for v in by_iter.values())
    out["t_merge"] = statistics.median(r.get("t_merge", 0.0) for r in rows)
    # DDP: its all-reduce window inside backward (hidden or not; the unhidden part is in t_commu)
    out["t_commu_backward"] = statistics.median(r.get("t_commu_backward", 0.0) for r in rows)
    # the rest of the step, everything but compute and communication (data, selection, the
    # update, the non-finite check): per row, then the median (medians do not subtract)
    out["t_rest"] = statistics.median(r["t_iter"] - r["t_compute"] - r["t_commu"] for r in rows)
    # its local part: t_rest without the non-finite check, whose flag all-reduce is a
    # collective (at P > 1 it waits for the slowest rank and pays a latency per hop)
    out["t_local"] = statistics.median(r["t_data"] + r["t_compr"] + r["t_update"] for r in rows)
    # the largest worker's peak resident memory in the job (MiB; rows of older runs lack it)
    out["rss_peak_mb"] = max(r.get("rss_peak_mb", 0.0) for r in rows)
    out.update(memory)
    out.update(time_base(rows))
    out.update(regime)
    return out
