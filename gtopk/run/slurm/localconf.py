"""The local test cluster's files and packages (``gtopk.run.slurm.local`` starts it): the
Debian packages it needs and their installation, ``slurm.conf`` and ``slurmdbd.conf`` for this
host, the environment SLURM's clients need to find it, and the guards on its state folder.

The state folder is private to the user who runs ``up``: created mode 0700 (an existing one is
used only when this uid owns it with no group/other access, under parents no other user can
swap it in); secrets (``munge.key``, the database's password, ``slurmdbd.conf``) are created
mode 0600 and never exist with wider bits; a marker (:data:`MARKER`: a random token and the
creating uid) says this project made the folder, and ``down`` deletes only a folder that has
it."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import stat
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
#: the file ``up`` writes into the state folder: it made the folder, ``down`` may delete it
MARKER = ".gtopk-slurm-local"
#: the accounting database's account slurmdbd logs in as (over 127.0.0.1, with a password)
DB_USER = "slurm"
DB_NAME = "slurm_acct_db"


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be brought up here; the message says why and what to do."""


class NotInstalled(SlurmUnavailable):
    """The packages are missing and cannot be installed by this process (``up`` exits 3)."""


class UnsafeState(ValueError):
    """The state folder is not this user's private folder, or not one ``up`` made; the
    one-line message names it and the fix (the command exits 2)."""


def write_secret(path: Path, data: str | bytes) -> Path:
    """Create ``path`` (which must not exist; a symlink is refused) mode 0600 from the start,
    whatever the umask, and write ``data``: no moment where others may read it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o600)  # a umask can only have taken bits; this gives back only the owner's
        out.write(data.encode() if isinstance(data, str) else data)
    return path


def check_private(state: Path) -> None:
    """Raise :class:`UnsafeState` unless ``state`` is a folder (not a symlink) owned by this uid
    with no group/other access, whose parents only root or this uid may change (a parent
    others may write, without the sticky bit, lets them swap the folder)."""
    uid = os.geteuid()
    try:
        st = os.lstat(state)
    except FileNotFoundError:
        raise UnsafeState(f"--state={state} does not exist; `up` creates it") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeState(f"--state={state} is not a folder (a symlink or a file); pick another path")
    if st.st_uid != uid:
        raise UnsafeState(f"--state={state} is owned by uid {st.st_uid}, not you ({uid}); pick another path")
    if st.st_mode & 0o077:
        mode = oct(stat.S_IMODE(st.st_mode))
        raise UnsafeState(f"--state={state} has mode {mode}, open to others; chmod 700 it or pick another path")
    for parent in state.parents:
        pst = os.stat(parent)
        if pst.st_uid not in (0, uid) or (pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX):
            raise UnsafeState(f"--state={state}: its parent {parent} may be changed by others; pick another path")


def private_folder(state: Path) -> Path:
    """``state`` as this user's private folder: created mode 0700 when absent (its parents as
    usual), else checked by :func:`check_private`."""
    state.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(state, 0o700)
    except FileExistsError:
        pass
    check_private(state)
    return state


def write_marker(state: Path) -> str:
    """Write :data:`MARKER` (a random token and this uid, mode 0600) into ``state``; return the token."""
    token = secrets.token_urlsafe(24)
    write_secret(state / MARKER, json.dumps({"uid": os.geteuid(), "token": token}) + "\n")
    return token


def check_marker(state: Path) -> str:
    """Raise :class:`UnsafeState` unless ``state`` is private (:func:`check_private`) and holds
    a marker that this uid wrote (a regular 0600 file of this uid naming it); return its token."""
    check_private(state)
    path, uid = state / MARKER, os.geteuid()
    try:
        st, data = os.lstat(path), json.loads(path.read_text())
    except (OSError, ValueError):
        st, data = None, None
    valid = (
        st is not None
        and stat.S_ISREG(st.st_mode)
        and st.st_uid == uid
        and not st.st_mode & 0o077
        and isinstance(data, dict)
        and data.get("uid") == uid
        and isinstance(data.get("token"), str)
        and len(data["token"]) >= 16
    )
    if not valid:
        raise UnsafeState(
            f"--state={state} has no {MARKER} written by uid {uid}, so `up` did not make it; "
            "left as it is (remove it yourself if it is yours)"
        )
    return data["token"]


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


def write_db_secrets(state: Path) -> str:
    """A new random password for the database account :data:`DB_USER`, written 0600 to
    ``state/mariadb.pass`` and into ``state/mariadb-init.sql`` (0600: the SQL that
    ``mariadb-install-db --extra-file`` runs to create the account); returns the password."""
    password = secrets.token_urlsafe(24)  # [A-Za-z0-9_-]: safe inside SQL quotes and slurmdbd.conf
    write_secret(state / "mariadb.pass", password + "\n")
    write_secret(
        state / "mariadb-init.sql",
        "FLUSH PRIVILEGES;\n"  # the bootstrap runs without grant tables; account statements need them
        f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}';\n"
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';\n",
    )
    return password


def db_commands(state: Path, port: int) -> tuple[list[str], list[str]]:
    """``mariadb-install-db`` and ``mariadbd`` for the accounting database in ``state/db``:
    root only through the unix socket (as this OS user; the socket lies in the private
    folder), :data:`DB_USER` with its password over TCP, the port bound to 127.0.0.1 only."""
    db, me = state / "db", user()
    install = ["mariadb-install-db", "--no-defaults", f"--datadir={db}", f"--user={me}", "--skip-test-db"]
    install += ["--auth-root-authentication-method=socket", f"--extra-file={state / 'mariadb-init.sql'}"]
    server = ["mariadbd", "--no-defaults", f"--datadir={db}", f"--socket={db}/mariadb.sock", f"--port={port}"]
    server += [
        "--bind-address=127.0.0.1",
        "--skip-name-resolve",
        f"--user={me}",
        f"--log-error={state}/log/mariadb.log",
    ]
    return install, server


def db_env(state: Path) -> dict[str, str]:
    """:func:`client_env` plus MariaDB's own umask: its files 0600, its folders 0700."""
    return dict(client_env(state), UMASK="0600", UMASK_DIR="0700")


def write_dbd_conf(state: Path, db_port: int, dbd_port: int, password: str) -> Path:
    """``state/slurmdbd.conf`` (slurmdbd finds it beside SLURM_CONF), created mode 0600 (it holds
    the database password; slurmdbd insists on it too); returns its path."""
    return write_secret(
        state / "slurmdbd.conf",
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
StorageUser={DB_USER}
StoragePass={password}
StorageLoc={DB_NAME}
""",
    )


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
