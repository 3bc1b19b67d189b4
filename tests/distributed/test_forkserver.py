"""Workers forked from the fork server (``gtopk.run.forkserver``): they get what the launcher
has when the group starts, not what it had when the server started, and they die with the
launcher, SIGKILL included."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtopk.run import forkserver
from gtopk.run.pool import WorkerGroup
from tests.procs import ROOT, wait_session_empty

pytestmark = pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server on this platform"
)

PROBE = "GTOPK_TEST_SET_AFTER_THE_SERVER"
GONE = "GTOPK_TEST_UNSET_AFTER_THE_SERVER"


def what_a_worker_has(rank: int, P: int) -> dict:
    """This worker's view of the probe variables, its parent, and a line on its stdout."""
    print(f"stdout of rank {rank}", flush=True)
    return {"probe": os.environ.get(PROBE), "gone": os.environ.get(GONE), "ppid": os.getppid()}


def server_pid() -> int | None:
    return multiprocessing.forkserver._forkserver._forkserver_pid


def test_a_forked_worker_gets_the_environment_set_after_the_server_started(monkeypatch, capfd):
    monkeypatch.setenv(GONE, "before")
    with WorkerGroup(1, timeout=300, start_method="forkserver") as group:  # the server runs from here on
        assert group.start_method == "forkserver"
        assert group.run(what_a_worker_has)[0]["gone"] == "before"
    server = server_pid()
    monkeypatch.setenv(PROBE, "after")
    monkeypatch.delenv(GONE)
    with WorkerGroup(2, timeout=300, start_method="forkserver") as group:
        out = group.run(what_a_worker_has)
    assert server_pid() == server, "the server was restarted: this test would prove nothing"
    assert out == [{"probe": "after", "gone": None, "ppid": server}] * 2
    printed = capfd.readouterr().out  # the launcher's stdout as it is now (pytest's capture), as spawn gives it
    assert "stdout of rank 0" in printed and "stdout of rank 1" in printed


def test_an_import_time_variable_that_changed_since_the_server_started_means_spawn(monkeypatch):
    with WorkerGroup(1, timeout=300, start_method="forkserver") as group:
        assert group.start_method == "forkserver"
    monkeypatch.setenv("OMP_SCHEDULE", "dynamic" if os.environ.get("OMP_SCHEDULE") != "dynamic" else "static")
    with WorkerGroup(1, timeout=300, start_method="forkserver") as group:
        assert group.start_method == "spawn"
        assert group.run(what_a_worker_has)[0]["ppid"] == os.getpid()


def test_a_start_method_is_named_or_refused(monkeypatch):
    with pytest.raises(ValueError, match="start_method='fork'"):
        WorkerGroup(1, start_method="fork")
    monkeypatch.setenv(forkserver.METHOD_ENV, "spawn")
    with WorkerGroup(1, timeout=300) as group:
        assert group.start_method == "spawn"


LAUNCHER = """
import multiprocessing.forkserver, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gtopk.run.pool import WorkerGroup
from tests.workers import sleep_forever
if __name__ == "__main__":
    with WorkerGroup(2, timeout=600, start_method="forkserver") as group:
        Path(sys.argv[2], "server.pid").write_text(str(multiprocessing.forkserver._forkserver._forkserver_pid))
        group.run(sleep_forever, (sys.argv[2],))
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_forked_workers_and_their_server_die_when_the_launcher_is_sigkilled(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    launcher = subprocess.Popen([sys.executable, str(script), str(ROOT), str(tmp_path)], start_new_session=True)
    deadline = time.monotonic() + 300  # failure bound only: the loop ends when the files are there
    pid_files = [tmp_path / "server.pid", tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    while not all(f.exists() and f.read_text() for f in pid_files):
        assert launcher.poll() is None and time.monotonic() < deadline, "the launcher or its workers did not start"
        time.sleep(0.05)
    server, *workers = (int(f.read_text()) for f in pid_files)
    for pid in workers:  # forked by the server, not spawned by the launcher
        assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == server
    launcher.kill()
    launcher.wait()
    assert not wait_session_empty(launcher.pid)
    assert not any(alive(pid) for pid in (server, *workers))
