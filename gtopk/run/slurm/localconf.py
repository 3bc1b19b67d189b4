"""The local test cluster's files and packages (``gtopk.run.slurm.local`` starts it): the
Debian packages it needs and their installation, ``slurm.conf`` and ``slurmdbd.conf`` for this
host, and the environment SLURM's clients need to find it."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

#: the daemons and clients this needs, and the Debian package of each
TOOLS = {
    "munged": "munge",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
    "slurmdbd": "slurmdbd",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
}
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
PARTITION = "local"
CLUSTER = "gtopk"


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be brought up here; the message says why and what to do."""


class NotInstalled(SlurmUnavailable):
    """The packages are missing and cannot be installed by this process (``up`` exits 3)."""


def tool(name: str) -> str | None:
    """Path of ``name`` on PATH or in the sbin directories (not always on a user's PATH)."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def ensure_installed() -> None:
    """Install the missing packages with apt-get (as root), or raise saying how."""
    missing = sorted({pkg for name, pkg in TOOLS.items() if tool(name) is None})
    if not missing:
        return
    command = f"apt-get install -y --no-install-recommends {' '.join(missing)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise NotInstalled(
            f"SLURM is not installed ({', '.join(missing)} missing); on Debian/Ubuntu: sudo {command}, "
            "elsewhere your distribution's slurm and munge packages"
        )
    print(f"installing {' '.join(missing)} (apt-get) ...", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], command.split()):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
            raise NotInstalled(f"`{' '.join(cmd)}` failed: {tail}")
    still = [name for name in TOOLS if tool(name) is None]
    if still:
        raise NotInstalled(f"installed {' '.join(missing)} but {', '.join(still)} still not found")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_line() -> str:
    """This host's ``NodeName=... CPUs=... RealMemory=...`` as slurmd measures it."""
    done = subprocess.run([tool("slurmd") or "slurmd", "-C"], capture_output=True, text=True)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("NodeName=")), None)
    if line is None:
        raise SlurmUnavailable(f"`slurmd -C` printed no node line: {(done.stderr or done.stdout).strip()[-300:]}")
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    return " ".join(f"{k}={fields[k]}" for k in keep if k in fields)


def user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def write_conf(state: Path, dbd_port: int) -> Path:
    """``state/slurm.conf`` for this host; returns its path."""
    node = socket.gethostname().split(".")[0]
    conf = f"""# written by python -m gtopk.run.slurm.local up (single-node test cluster)
ClusterName={CLUSTER}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user()}
SlurmdUser={user()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={state}/munge/munge.socket
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/log/slurmctld.log
SlurmdLogFile={state}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd_port}
AccountingStoragePass={state}/munge/munge.socket
JobCompType=jobcomp/none
KillWait=10
NodeName={node} NodeAddr=127.0.0.1 {node_line()} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
    path = state / "slurm.conf"
    path.write_text(conf)
    return path


def client_env(state: Path) -> dict[str, str]:
    """This process's environment with SLURM_CONF pointing at the cluster and the sbin
    directories on PATH."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    return dict(os.environ, SLURM_CONF=str(state / "slurm.conf"), PATH=path)


def write_dbd_conf(state: Path, db_port: int, dbd_port: int) -> None:
    """``state/slurmdbd.conf`` (slurmdbd finds it beside SLURM_CONF; mode 600, as it insists)."""
    path = state / "slurmdbd.conf"
    path.write_text(
        f"""# written by python -m gtopk.run.slurm.local up
AuthType=auth/munge
AuthInfo=socket={state}/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser={user()}
PidFile={state}/slurmdbd.pid
LogFile={state}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=root
StorageLoc=slurm_acct_db
"""
    )
    path.chmod(0o600)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
