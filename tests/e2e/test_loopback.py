"""A job on this machine alone listens on loopback only: a ``cluster=local`` job of
``run.py`` opens no socket on the machine's network (the rendezvous store, gloo's
listeners, the ranks' connections), and the workers get GLOO_SOCKET_IFNAME /
NCCL_SOCKET_IFNAME naming the loopback device unless the environment names another.

Unset, gloo binds whatever address the hostname resolves to: on a cloud VM its LAN
address, so every sweep would leave unauthenticated listeners on the LAN. Where this
machine's hostname resolves to 127.0.0.1 (as on the test machine) that cannot be seen, so
the job runs, where it can (root, ``unshare``), in its own UTS namespace whose hostname is
this machine's LAN address: the cloud VM's case. There, without the fix, both ranks'
gloo listeners are on the LAN address and the test fails.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gtopk.records.rundir import read_jsonl
from gtopk.run.spawn import spawn
from gtopk.run.world import SOCKET_IFNAME_VARS, is_loopback, loopback_ifname
from tests.procs import FAST, ROOT, finish, session_processes

#: how long a job of 2 ranks may take to start on a loaded 2-core machine (a hang guard:
#: the wait ends as soon as both ranks have written a row)
START_S = 300


def ipv4_interfaces() -> dict[str, str]:
    """This machine's interfaces that have an IPv4 address: name -> address."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                ifreq = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
            found[name] = socket.inet_ntoa(ifreq[20:24])
    return found


def lan_interface() -> tuple[str, str] | None:
    """(name, address) of an interface with a non-loopback IPv4 address, if there is one."""
    return next(((n, a) for n, a in ipv4_interfaces().items() if not ipaddress.ip_address(a).is_loopback), None)


def can_set_hostname() -> bool:
    """Whether a process may get a hostname of its own here (a UTS namespace: root, unshare)."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


def _address(hexaddr: str) -> str:
    """An address of /proc/net/{tcp,udp}[6] (host byte order, 32-bit words) as text."""
    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def inet_sockets() -> dict[int, tuple[str, str, int, str]]:
    """Every IPv4/IPv6 TCP and UDP socket of this network namespace: inode ->
    (protocol, local address, local port, state; '0A' is a TCP LISTEN)."""
    found = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, port = fields[1].rsplit(":", 1)
            found[int(fields[9])] = (proto, _address(addr), int(port, 16), fields[3])
    return found


def sockets_of(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` has open."""
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def start_job(hostname: str | None, *args: str) -> subprocess.Popen:
    """``run.py *args`` in a new session (as ``tests.procs.start``), in a UTS namespace of
    its own whose hostname is ``hostname`` (None: this machine's)."""
    cmd = [sys.executable, str(ROOT / "run.py"), *args]
    if hostname is not None:  # unshare and sh exec: run.py keeps the session leader's pid
        cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *cmd]
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="0")
    for key in SOCKET_IFNAME_VARS:
        env.pop(key, None)  # the default: nothing set by the user
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
    proc.outputs = (out, err)  # type: ignore[attr-defined]
    return proc


def stderr(proc: subprocess.Popen) -> str:
    """What ``proc`` (from ``start_job``) wrote to stderr so far."""
    f = proc.outputs[1]  # type: ignore[attr-defined]
    f.seek(0)
    return f.read()


def test_a_local_job_listens_on_loopback_only(tmp_path):
    """Two ranks, rank 1 hung at iteration 1 so that the job stays up: once both have written
    a row (every rank joined, rendezvous and gloo connections made), every inet socket of the
    job's processes is on loopback, and each rank owns a listener (gloo's; so the check is
    not vacuous). SIGTERM then ends the job, leaving no process."""
    lan = lan_interface()
    hostname = lan[1] if lan and can_set_hostname() else None  # the cloud VM's case, where it can be made
    print(f"hostname of the job: {hostname or socket.gethostname() + ' (this machine: no UTS namespace)'}")
    job = tmp_path / "run"
    args = ["nodes=2", "cluster=local", "fault.kind=hang", "fault.rank=1", "fault.at_iter=1"]
    proc = start_job(hostname, *FAST, *args, "timeout_s=900", "collective_timeout_s=900", f"hydra.run.dir={job}")
    try:
        deadline = time.monotonic() + START_S
        while not all(read_jsonl(job / f"iters.rank{r}.jsonl") for r in (0, 1)):  # both joined and stepped
            assert proc.poll() is None, f"run.py exited {proc.returncode} early:\n{stderr(proc)[-3000:]}"
            assert time.monotonic() < deadline, f"the ranks did not both step within {START_S}s"
            time.sleep(0.1)
        ranks = {read_jsonl(job / f"iters.rank{r}.jsonl")[0]["pid"]: r for r in (0, 1)}
        table = inet_sockets()
        pids = [int(line.split()[0]) for line in session_processes(proc.pid)]
        held = {pid: [table[i] for i in sockets_of(pid) if i in table] for pid in pids}
        for pid, socks in held.items():
            print(f"pid {pid} (rank {ranks.get(pid, '-')}): {socks}")
        outside = [(pid, s) for pid, socks in held.items() for s in socks if s[2] and not is_loopback(s[1])]
        assert not outside, f"sockets of the job outside loopback (pid, (protocol, address, port, state)): {outside}"
        for pid, r in ranks.items():
            listeners = [s for s in held.get(pid, []) if s[0].startswith("tcp") and s[3] == "0A"]
            assert listeners, f"rank {r} (pid {pid}) owns no listening socket: {held.get(pid)}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        done = finish(proc, timeout=120)
    assert done.returncode != 0 and not done.left, (done.left, done.stderr[-3000:])


def socket_env(rank: int, world_size: int) -> dict[str, str | None]:
    """A worker's (spawned) view of the socket interface variables."""
    return {key: os.environ.get(key) for key in SOCKET_IFNAME_VARS}


def test_workers_get_the_loopback_device_unless_the_environment_names_one(monkeypatch):
    """The variables the socket check above relies on, seen by the workers of a loopback
    group: the loopback device by default; a variable the user set stays as it is (here a
    real interface, so that gloo can still bind it)."""
    for key in SOCKET_IFNAME_VARS:
        monkeypatch.delenv(key, raising=False)
    lo = loopback_ifname()
    assert ipv4_interfaces().get(lo, "").startswith("127.")
    assert spawn(socket_env, 2, timeout=START_S) == [{key: lo for key in SOCKET_IFNAME_VARS}] * 2
    lan = lan_interface()
    if lan is not None:  # else there is no other interface gloo could bind
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", lan[0])
        assert spawn(socket_env, 2, timeout=START_S) == [{"GLOO_SOCKET_IFNAME": lan[0], "NCCL_SOCKET_IFNAME": lo}] * 2
