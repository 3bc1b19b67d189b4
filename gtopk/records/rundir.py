"""What a job leaves in its run directory, written so that a crash loses nothing written.

* ``config.yaml``: the resolved config; ``env.json``: versions, device, CPU/GPU, git commit.
* ``iters.rank<r>.jsonl``: one line per iteration and rank (timings, record), appended
  and flushed line by line; ``epochs.jsonl``: per-epoch metrics (rank 0). A crash can
  leave a half-written last line: appending first closes it off with a newline, and
  ``read_jsonl`` skips it (never fatal). Rows carry the job's ``attempt``.
* ``summary.json``: medians over all ranks' post-warm-up iterations; written atomically
  (temp file + rename), so its presence means the job finished.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

SUMMARY = "summary.json"
TIMINGS = ("t_data", "t_compute", "t_compr", "t_commu", "t_update", "t_iter")


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class JsonLines:
    """Append-only JSON-lines file; every line is flushed as it is written. A half-written
    last line left by a crash is closed off (newline) before the first new line."""

    def __init__(self, path: Path):
        self.path = path
        self.f = open(path, "a", buffering=1)
        if path.stat().st_size and not _ends_with_newline(path):
            self.f.write("\n")

    def write(self, row: dict) -> None:
        self.f.write(json.dumps(row, default=float) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file; a half-written last line (a crash) is skipped."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).resolve().parent, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str, backend: str) -> dict:
    import hydra
    import torchvision

    import gtopk

    env = {
        "gtopk": gtopk.__version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
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


def summarize(rows: Iterable[dict], meta: dict, images_per_iter: int) -> dict:
    """Medians over post-warm-up iterations of all ranks (iterations where rank 0 is
    slowest and where it is fastest both count); steps skipped for a non-finite gradient
    are counted (iterations), not timed."""
    rows = [r for r in rows if not r.get("warmup")]
    skipped = len({r.get("iter") for r in rows if r.get("nonfinite")})
    rows = [r for r in rows if not r.get("nonfinite")]
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
    # t_commu of the rank that entered each step's collective last (it waited for no
    # other rank's compute or selection): the collective's own time, skew excluded
    by_iter: dict = {}
    for r in rows:
        by_iter.setdefault(r.get("iter"), []).append(r["t_commu"])
    out["t_commu_last_arrival"] = statistics.median(min(v) for v in by_iter.values())
    out["t_merge"] = statistics.median(r.get("t_merge", 0.0) for r in rows)
    return out
