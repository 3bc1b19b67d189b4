"""A single-node SLURM cluster on this machine, for tests and for trying the SLURM
launcher on a laptop: ``python -m gtopk.run.slurm.local up|down|status|env [--state DIR]``.

``up`` installs Debian's packages when they are missing (``apt-get``, as root; otherwise it
says how), writes a ``slurm.conf`` for this host (its real CPUs and memory, from
``slurmd -C``; free ports; one partition ``local``; whole-node jobs) under the state
directory, and starts there, each in its own session with its process id in ``pids.json``:
``munged`` (authentication), ``mariadbd`` and ``slurmdbd`` (accounting: ``sacct``, which
submitit reads to learn how a job ended), ``slurmctld`` and ``slurmd``; it returns once
``sinfo`` shows the node idle. Nothing outside the state directory is touched: the clients
find the cluster through ``SLURM_CONF`` (``eval "$(python -m gtopk.run.slurm.local env)"``).
``down`` cancels the jobs, stops the daemons by their ids and removes the state directory.

The state directory is private (mode 0700, this uid's; see :mod:`.localconf`), so only its
owner reaches munged's and MariaDB's sockets; secrets are created mode 0600; the database
has a random password and listens on 127.0.0.1 only; ``down`` (and ``status``) act only on a
folder holding the marker ``up`` wrote, and refuse any other in one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gtopk.run.slurm.localconf import (
    CLUSTER,
    MARKER,
    PARTITION,
    NotInstalled,
    SlurmUnavailable,
    UnsafeState,
    check_marker,
    check_private,
    client_env,
    db_commands,
    db_env,
    ensure_installed,
    free_port,
    listening,
    private_folder,
    tool,
    user,
    write_conf,
    write_db_secrets,
    write_dbd_conf,
    write_marker,
    write_secret,
)
from gtopk.run.supervise import alive

__all__ = ["UnsafeState", "alive", "client_env", "down", "status", "up"]

UP_TIMEOUT_S = 120.0


def default_state() -> Path:
    """``$GTOPK_SLURM_STATE``, else ``/tmp/gtopk-slurm-<uid>`` (used only if private to this uid)."""
    return Path(os.environ.get("GTOPK_SLURM_STATE", f"/tmp/gtopk-slurm-{os.getuid()}"))


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> int:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True).pid


def node_state(state: Path) -> str | None:
    """The node's state as sinfo prints it (``idle``, ``alloc``, ...), or None."""
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], env=client_env(state), capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def daemons(state: Path) -> dict[str, int]:
    try:
        return json.loads((state / "pids.json").read_text())
    except (OSError, ValueError):
        return {}


def made_by_up(state: Path) -> bool:
    """Whether ``state`` holds the marker ``up`` wrote (checked); False when it is absent, or
    private and empty (``up`` may use it); :class:`UnsafeState` for any other folder."""
    if not os.path.lexists(state):
        return False
    check_private(state)
    if os.path.lexists(state / MARKER):
        check_marker(state)
        return True
    if any(state.iterdir()):
        raise UnsafeState(f"--state={state} holds files but no {MARKER}, so `up` did not make it; pick a new path")
    return False


def up(state: Path) -> None:
    """Bring the cluster up (idempotent); return once sinfo shows the node idle."""
    made = made_by_up(state)
    ensure_installed()
    pids = daemons(state) if made else {}
    if pids and all(alive(p) for p in pids.values()) and node_state(state):
        print(f"SLURM is already up: {state / 'slurm.conf'}")
        return
    if made:
        down(state)  # a stale cluster (or an interrupted `up`): start afresh
    private_folder(state)
    write_marker(state)
    for sub in ("munge", "db", "ctld", "spool", "log"):
        (state / sub).mkdir(mode=0o700, exist_ok=True)
    key, m, log = state / "munge" / "munge.key", state / "munge", state / "log"
    write_secret(key, os.urandom(1024))
    db_port, dbd_port = free_port(), free_port()
    conf = write_conf(state, dbd_port)
    write_dbd_conf(state, db_port, dbd_port, write_db_secrets(state))
    install_db, mariadbd = db_commands(state, db_port)
    env, node, pids = client_env(state), socket.gethostname().split(".")[0], {}

    def start(name: str, cmd: list[str], ready: Callable[[], bool], what: str, env: dict[str, str] = env) -> None:
        pids[name] = _start([tool(cmd[0]) or cmd[0], *cmd[1:]], log / f"{name}.out", env)
        (state / "pids.json").write_text(json.dumps(pids))
        _wait(ready, pids, state, what)

    start(  # --force: munged wants its socket's folder open to all; ours is private to this user
        "munged",
        ["munged", "--foreground", "--force", f"--socket={m}/munge.socket", f"--key-file={key}"]
        + [f"--pid-file={m}/munged.pid", f"--log-file={log}/munged.log", f"--seed-file={m}/munged.seed"],
        lambda: (m / "munge.socket").exists(),
        "munged's socket",
    )
    _run(install_db, state, db_env(state))
    (state / "mariadb-init.sql").unlink()  # the account exists; its password stays in mariadb.pass
    start("mariadbd", mariadbd, lambda: listening(db_port), "the accounting database", db_env(state))
    start("slurmdbd", ["slurmdbd", "-D"], lambda: listening(dbd_port), "slurmdbd")
    _run(["sacctmgr", "-i", "add", "cluster", CLUSTER], state, env)
    start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)], lambda: True, "slurmctld")
    start("slurmd", ["slurmd", "-D", "-N", node, "-f", str(conf)], lambda: node_state(state) == "idle", "an idle node")
    print(f"SLURM is up: node {node} idle in partition {PARTITION} ({conf}); clients need SLURM_CONF:")
    print(f"  export SLURM_CONF={conf}")


def _run(cmd: list[str], state: Path, env: dict[str, str]) -> None:
    """Run a set-up command; on failure take everything down and raise with its output."""
    done = subprocess.run([tool(cmd[0]) or cmd[0], *cmd[1:]], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        down(state)
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise SlurmUnavailable(f"`{' '.join(cmd)}` failed: {tail[-500:]}")


def _wait(ready: Callable[[], bool], pids: dict[str, int], state: Path, what: str) -> None:
    """Poll ``ready()`` until true; raise if a daemon died or UP_TIMEOUT_S passed."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    while not ready():
        dead = [name for name, pid in pids.items() if not alive(pid)]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else f"no {what} after {UP_TIMEOUT_S:.0f}s"
            logs = sorted((state / "log").glob("*"))
            tail = " | ".join(ln for p in logs if p.exists() for ln in p.read_text().strip().splitlines()[-2:])
            down(state)
            raise SlurmUnavailable(f"SLURM did not come up: {why}; {tail[-600:]}")
        time.sleep(0.2)


def down(state: Path) -> bool:
    """Cancel every job, stop the daemons (by their recorded ids), remove ``state``; False when
    there is no ``state``. A folder without the marker ``up`` wrote (this uid's) is left
    untouched, its pids unread: :class:`UnsafeState`."""
    if not os.path.lexists(state):
        return False
    check_marker(state)
    pids = daemons(state)
    if pids.get("slurmctld") and alive(pids["slurmctld"]):
        env = client_env(state)
        subprocess.run(["scancel", "--full", "-u", user()], env=env, capture_output=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            q = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True)
            if q.returncode != 0 or not q.stdout.strip():
                break
            time.sleep(0.2)
    for name in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"):
        pid = pids.get(name)
        if pid and alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(state)
    return True


def status(state: Path) -> bool:
    """Print the daemons' and the node's state; True when the cluster is up. Reads only a
    folder ``up`` made (:class:`UnsafeState` otherwise: its slurm.conf would steer sinfo)."""
    if os.path.lexists(state):
        check_marker(state)
    pids = daemons(state)
    running = {name: alive(pid) for name, pid in pids.items()}
    node = node_state(state) if pids else None
    ok = bool(pids) and all(running.values()) and node is not None
    procs = ", ".join(f"{n} {pids[n]} {'running' if a else 'gone'}" for n, a in running.items()) or "no daemons"
    print(f"SLURM {'up' if ok else 'down'} ({state}): {procs}; node {node or '-'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gtopk.run.slurm.local", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status", "env"])
    parser.add_argument("--state", type=Path, default=default_state(), help="state directory (default %(default)s)")
    args = parser.parse_args(argv)
    state = args.state.resolve()
    if args.action == "env":
        print(f"export SLURM_CONF={state / 'slurm.conf'}")
        return 0
    if args.action == "up" and (not re.fullmatch(r"[\w./-]+", str(state)) or len(str(state)) > 80):
        print(f"error: --state={state}: use a short path without spaces (sockets live there)", file=sys.stderr)
        return 2
    try:
        if args.action == "status":
            return 0 if status(state) else 1
        if args.action == "down":
            print(f"SLURM down ({state} removed)" if down(state) else f"SLURM down (no {state})")
            return 0
        up(state)
    except UnsafeState as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SlurmUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 3 if isinstance(e, NotInstalled) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
