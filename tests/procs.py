"""Helpers for the failure tests: run ``run.py`` in its own session, and find what a
session or a port still holds afterwards (from /proc, no psutil)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: a benchmark job that takes about a second per rank: tiny batches, 1 + 2 iterations
FAST = ["batch_size=4", "benchmark.warmup=1", "benchmark.iters=2", "data.train_size=64", "logger.wandb=false"]


def start(*args: str, sigint: str = "default") -> subprocess.Popen:
    """``python run.py *args`` in a new session (its id is the process id); stdout and
    stderr go to files, so that waiting for it never waits for its descendants.

    ``sigint``: how run.py finds SIGINT. ``"default"``, as a terminal's foreground job
    gets it (Ctrl-C raises KeyboardInterrupt). Set here rather than inherited: when pytest
    itself runs with SIGINT ignored (a background job of a non-interactive shell,
    ``make test &`` in a CI script), its children would inherit SIG_IGN, CPython would
    install no KeyboardInterrupt handler and run.py would, rightly, ignore Ctrl-C.
    ``"ignore"``: as such a background (or nohup) job."""
    disposition = {"default": signal.SIG_DFL, "ignore": signal.SIG_IGN}[sigint]
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="0")
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=err,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
    )
    proc.outputs = (out, err)  # type: ignore[attr-defined]
    return proc


@dataclass
class Done:
    """How a ``run.py`` process ended."""

    returncode: int
    stdout: str
    stderr: str
    ended: float  # time.time() when run.py exited
    left: list[str]  # processes of its session still alive LEFTOVER_S after it exited


#: how long the processes of run.py's session get to exit after run.py did: generous (a
#: loaded 2-core machine), since waiting ends as soon as the session is empty; a worker or
#: loader process still alive after that is left over (it would live on)
LEFTOVER_S = 60.0


def finish(proc: subprocess.Popen, timeout: float = 300) -> Done:
    """Wait for ``proc`` (at most ``timeout``: a hang guard); then until its session is
    empty (at most LEFTOVER_S)."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise AssertionError(f"run.py did not finish within {timeout}s:\n{_read(proc.outputs[1])[-3000:]}") from None
    ended = time.time()
    left = wait_session_empty(proc.pid, timeout=LEFTOVER_S)
    out, err = (_read(f) for f in proc.outputs)
    return Done(proc.returncode, out, err, ended, left)


def _read(f: Any) -> str:
    f.seek(0)
    text = f.read()
    f.close()
    return text


def run(*args: str, timeout: float = 300) -> Done:
    return finish(start(*args), timeout)


def session_processes(sid: int) -> list[str]:
    """'pid cmdline' of every live (non-zombie) process in session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[3]) == sid:
                found.append(f"{entry.name} {(entry / 'cmdline').read_text().replace(chr(0), ' ')[:120]}")
        except (OSError, IndexError, ValueError):
            continue
    return found


def wait_session_empty(sid: int, timeout: float = LEFTOVER_S) -> list[str]:
    """Poll until session ``sid`` has no live process (returns []), or ``timeout`` passed
    (returns what is still there)."""
    deadline = time.monotonic() + timeout
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def listening_ports() -> set[int]:
    """TCP ports something on this machine listens on (IPv4 and IPv6)."""
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def one_line_error(stderr: str) -> str:
    """The single non-empty stderr line (asserting there is exactly one)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr[-3000:]}"
    return lines[0]


def cifar_train(data: Path, reducer: str, *extra: str) -> list[str]:
    """run.py overrides of a short P = 2 training job on CIFAR-format files at ``data``:
    2 epochs, batch 16, loaders in-process, no wandb (then ``extra``)."""
    return [
        "mode=train",
        "nodes=2",
        f"reducer={reducer}",
        *extra,
        "data=cifar10",
        f"data.root={data}",
        "data.verify=false",
        "train.epochs=2",
        "train.loader_workers=0",
        "model.batch_size.train=16",
        "logger.wandb=false",
    ]


def simulated_train(nodes: int = 3, epochs: int = 2, train_size: int = 144, test_size: int = 24) -> list[str]:
    """run.py overrides of a short ``cluster=simulated`` gTop-k training job on the offline
    digits at 16 x 16: ``epochs`` epochs of 2 steps of 8 images per rank, no wandb."""
    return [
        "cluster=simulated",
        "mode=train",
        f"nodes={nodes}",
        "reducer=gtopk",
        "density=0.01",
        "data=digits",
        "data.image_size=16",
        f"data.train_size={train_size}",
        f"data.test_size={test_size}",
        "batch_size=8",
        f"train.epochs={epochs}",
        "train.max_iters_per_epoch=2",
        "logger.wandb=false",
    ]
