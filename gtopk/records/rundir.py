"""What a job leaves in its run directory, written so that a crash loses nothing written.

``RunDir(path)`` names every file (the one place these names are spelled); ``run_dirs``,
``finished`` and ``failed`` find jobs under a root.

* ``config.yaml``: the resolved config (its presence makes a folder a run directory).
* ``iters.rank<r>.jsonl``: one line per iteration and rank (timings, record), appended
  and flushed line by line; ``epochs.jsonl``: per-epoch metrics (rank 0), with the
  coverage so far (``gtopk.records.regime``). A crash can
  leave a half-written last line: appending first closes it off with a newline, and
  ``read_jsonl`` skips it (never fatal). Rows carry the job's ``attempt``.
* ``summary.json``: medians over all ranks' post-warm-up iterations, with ``env``
  (versions, device, CPU/GPU, git commit) and, for training, the final coverage and the
  test top-1 trend (``gtopk.records.regime``); written atomically (temp file + rename), so
  its presence means the job finished.
* ``attempts.jsonl`` (one line per attempt), ``failed.json`` (the last attempt's error;
  never beside a ``summary.json``), ``.lock`` (flock of the process running the job):
  see ``gtopk.run.jobs``.
* ``checkpoint/rank<r>.pt``: per-rank training state of the last epoch (``gtopk.train.state``).
* ``wandb/``: the wandb run's files; ``<job name>.log``: Hydra's log of the job.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gtopk.records.regime import summary_fields

CONFIG = "config.yaml"
SUMMARY = "summary.json"
EPOCHS = "epochs.jsonl"
ATTEMPTS = "attempts.jsonl"
FAILED = "failed.json"
LOCK = ".lock"
CHECKPOINTS = "checkpoint"
WANDB = "wandb"
ITERS_GLOB = "iters.rank*.jsonl"
TIMINGS = ("t_data", "t_compute", "t_compr", "t_commu", "t_update", "t_iter")


@dataclass(frozen=True)
class RunDir:
    """The files of one job's run directory (paths only: nothing is created or read)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        """The resolved config."""
        return self.path / CONFIG

    @property
    def summary(self) -> Path:
        """Written last, atomically: the job finished."""
        return self.path / SUMMARY

    @property
    def epochs(self) -> Path:
        """Per-epoch metrics (rank 0, training)."""
        return self.path / EPOCHS

    @property
    def attempts(self) -> Path:
        """One line per attempt of the job."""
        return self.path / ATTEMPTS

    @property
    def failed(self) -> Path:
        """The last attempt's error."""
        return self.path / FAILED

    @property
    def lock(self) -> Path:
        """Locked (flock) by the process running the job."""
        return self.path / LOCK

    @property
    def checkpoints(self) -> Path:
        """The folder of per-rank checkpoints."""
        return self.path / CHECKPOINTS

    @property
    def wandb(self) -> Path:
        """The wandb run's folder."""
        return self.path / WANDB

    def iters(self, rank: int) -> Path:
        return self.path / f"iters.rank{rank}.jsonl"

    def all_iters(self) -> list[Path]:
        """Every rank's iteration file, by name."""
        return sorted(self.path.glob(ITERS_GLOB))

    def checkpoint(self, rank: int) -> Path:
        return self.checkpoints / f"rank{rank}.pt"

    def job_log(self, job_name: str) -> Path:
        """Hydra's log of the job (``hydra.job.name``, ``run`` for run.py)."""
        return self.path / f"{job_name}.log"

    @property
    def is_finished(self) -> bool:
        return self.summary.exists()

    @property
    def has_failed(self) -> bool:
        """The last attempt failed (and none finished since)."""
        return self.failed.exists() and not self.is_finished

    def read_summary(self) -> dict:
        return json.loads(self.summary.read_text())

    def read_config(self) -> dict:
        """The resolved config as a dict."""
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.load(self.config), resolve=True)


def run_dirs(roots: Iterable[str | Path]) -> list[RunDir]:
    """Run directories (holding ``config.yaml``) under ``roots``, Hydra's ``.hydra/`` and
    wandb's folders (which hold a ``config.yaml`` of their own) left out."""
    found = set()
    for root in roots:
        for cfg in Path(root).rglob(CONFIG):
            below = cfg.relative_to(root).parts[:-1]
            if ".hydra" not in below and WANDB not in below:
                found.add(cfg.parent)
    return [RunDir(d) for d in sorted(found)]


def finished(roots: Iterable[str | Path]) -> list[RunDir]:
    """Run directories under ``roots`` whose job finished (``summary.json``)."""
    return [d for d in run_dirs(roots) if d.is_finished]


def failed(roots: Iterable[str | Path]) -> list[RunDir]:
    """Run directories under ``roots`` whose last attempt failed (``failed.json``)."""
    return [d for d in run_dirs(roots) if d.has_failed]


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


#: ``summary.json``'s ``backend`` of a ``cluster=simulated`` run (no torch.distributed backend: its P
#: ranks are one process; ``gtopk.train.simulated`` writes it, ``analysis.training`` reads it)
SIMULATED_BACKEND = "in-process"


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


def summarize(rows: Iterable[dict], meta: dict, images_per_iter: int, epochs: Iterable[dict] | None = None) -> dict:
    """Medians over post-warm-up iterations of all ranks (iterations where rank 0 is
    slowest and where it is fastest both count); steps skipped for a non-finite gradient
    are counted (iterations), not timed. Training runs (``meta["mode"]``) also carry the
    coverage of all their iterations and, given the ``epochs`` rows, the trend of the test
    top-1 at the end (``gtopk.records.regime.summary_fields``)."""
    rows = list(rows)
    regime = summary_fields(rows, meta["params"], epochs) if meta.get("mode") == "train" else {}
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
    # the largest worker's peak resident memory in the job (MiB; rows of older runs lack it)
    out["rss_peak_mb"] = max(r.get("rss_peak_mb", 0.0) for r in rows)
    out.update(regime)
    return out
