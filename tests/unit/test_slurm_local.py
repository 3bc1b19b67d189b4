"""The local SLURM test cluster's guards, as functions (no slurm, munge or MariaDB needed):
its state folder is private to this uid (created 0700; an open, foreign or linked one is
refused in one line), secrets are created 0600 whatever the umask, the accounting database
gets a random password and a socket inside the state folder, and ``down``/``status`` act only
on a folder holding the marker ``up`` wrote (never deleting, or killing the pids listed in,
any other)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtopk.run.slurm import local, localconf

OTHER_UID = 12345
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="simulating another user needs root (os.chown)")


@pytest.fixture
def umask0() -> Iterator[None]:
    """The most permissive umask: whatever a file gets is what its creator asked for."""
    old = os.umask(0)
    yield
    os.umask(old)


@pytest.fixture
def creations(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Each file ``os.open`` creates, with its mode as observed right after creation."""
    seen: dict[str, int] = {}
    real = os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):  # noqa: ANN001, ANN202 - os.open's signature
        existed = os.path.lexists(path)
        fd = real(path, flags, mode, *args, **kwargs)
        if not existed:
            seen[str(path)] = stat.S_IMODE(os.fstat(fd).st_mode)
        return fd

    monkeypatch.setattr(os, "open", spy)
    return seen


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def one_line_naming(err: pytest.ExceptionInfo, folder: Path) -> str:
    msg = str(err.value)
    assert "\n" not in msg and f"--state={folder}" in msg, msg
    return msg


# -- the state folder ---------------------------------------------------------------------


def test_new_state_folder_is_created_private_even_under_umask_0(tmp_path, umask0):
    state = localconf.private_folder(tmp_path / "state")
    assert state.is_dir() and mode(state) == 0o700 and os.stat(state).st_uid == os.geteuid()


def test_state_folder_open_to_others_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    with pytest.raises(ValueError) as err:
        localconf.private_folder(state)
    assert "chmod 700" in one_line_naming(err, state)
    with pytest.raises(ValueError):
        local.made_by_up(state)
    assert mode(state) == 0o755  # refused, not silently changed


@as_root
def test_state_folder_of_another_user_is_refused(tmp_path):
    """The default path is predictable (/tmp/gtopk-slurm-<uid>): another user may make it first."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, OTHER_UID, OTHER_UID)
    with pytest.raises(ValueError) as err:
        localconf.private_folder(state)
    assert f"uid {OTHER_UID}" in one_line_naming(err, state)
    with pytest.raises(ValueError):
        local.made_by_up(state)


def test_state_folder_that_is_a_symlink_is_refused(tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(target)
    with pytest.raises(ValueError) as err:
        localconf.private_folder(tmp_path / "state")
    one_line_naming(err, tmp_path / "state")


@as_root
def test_state_folder_under_a_parent_others_may_change_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may rename the folder away and put another there
    with pytest.raises(ValueError) as err:
        localconf.private_folder(shared / "state")
    assert str(shared) in one_line_naming(err, shared / "state")
    shared.chmod(0o1777)  # sticky, as /tmp: fine
    assert mode(localconf.private_folder(shared / "state")) == 0o700


def test_up_uses_only_an_empty_or_marked_private_folder(tmp_path):
    state = localconf.private_folder(tmp_path / "state")
    assert local.made_by_up(tmp_path / "absent") is False
    assert local.made_by_up(state) is False  # private and empty: `up` may take it
    (state / "notes.txt").write_text("mine")
    with pytest.raises(ValueError) as err:
        local.made_by_up(state)
    assert localconf.MARKER in one_line_naming(err, state)
    (state / "notes.txt").unlink()
    localconf.write_marker(state)
    assert local.made_by_up(state) is True


# -- secrets ------------------------------------------------------------------------------


def test_secrets_are_never_created_readable_by_others(tmp_path, umask0, creations):
    key = localconf.write_secret(tmp_path / "munge.key", os.urandom(64))
    conf = localconf.write_dbd_conf(tmp_path, 1, 2, "pw-" + "x" * 20)
    password = localconf.write_db_secrets(tmp_path)
    localconf.write_marker(tmp_path)
    made = {Path(p).name: m for p, m in creations.items()}
    assert set(made) >= {"munge.key", "slurmdbd.conf", "mariadb.pass", "mariadb-init.sql", localconf.MARKER}
    assert all(m & 0o077 == 0 for m in made.values()), {n: oct(m) for n, m in made.items()}
    for path in (key, conf, tmp_path / "mariadb.pass", tmp_path / "mariadb-init.sql", tmp_path / localconf.MARKER):
        assert mode(path) == 0o600, path
    assert (tmp_path / "mariadb.pass").read_text().strip() == password


def test_a_secret_never_overwrites_or_follows_an_existing_path(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "munge.key").symlink_to(victim)
    with pytest.raises(FileExistsError):
        localconf.write_secret(tmp_path / "munge.key", b"secret")
    with pytest.raises(FileExistsError):
        localconf.write_secret(victim, b"secret")
    assert victim.read_text() == "keep"


# -- the accounting database --------------------------------------------------------------


def test_database_gets_a_random_password_and_a_socket_inside_the_state_folder(tmp_path):
    state = localconf.private_folder(tmp_path / "state")
    password = localconf.write_db_secrets(state)
    assert len(password) >= 20 and password != localconf.write_db_secrets(localconf.private_folder(tmp_path / "b"))
    conf = localconf.write_dbd_conf(state, 3306, 6819, password).read_text()
    fields = dict(line.split("=", 1) for line in conf.splitlines() if "=" in line)
    assert fields["StoragePass"] == password and fields["StorageUser"] == localconf.DB_USER != "root"
    assert fields["StorageHost"] == "127.0.0.1"
    sql = (state / "mariadb-init.sql").read_text()
    assert f"'{localconf.DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}'" in sql

    install, server = localconf.db_commands(state, 3306)
    opts = dict(arg.split("=", 1) for arg in [*install, *server] if arg.startswith("--") and "=" in arg)
    sock = Path(opts["--socket"])
    assert sock.is_relative_to(state) and sock.parent != state.parent
    assert opts["--bind-address"] == "127.0.0.1" and opts["--port"] == "3306"
    assert opts["--auth-root-authentication-method"] == "socket"  # no root with an empty password
    assert opts["--user"] == localconf.user() and Path(opts["--datadir"]).is_relative_to(state)
    assert Path(opts["--extra-file"]) == state / "mariadb-init.sql"
    assert localconf.db_env(state)["UMASK"] == "0600" and localconf.db_env(state)["UMASK_DIR"] == "0700"


# -- down and status ----------------------------------------------------------------------


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_down_refuses_a_folder_without_the_marker_and_leaves_it_intact(tmp_path, sleeper, capsys):
    """A folder that merely looks like a cluster's (slurm.conf, pids.json) is neither deleted
    nor are the processes it lists killed."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "slurm.conf").write_text("ClusterName=theirs\n")
    (state / "pids.json").write_text(json.dumps({"slurmd": sleeper.pid}))
    with pytest.raises(ValueError) as err:
        local.down(state)
    assert localconf.MARKER in one_line_naming(err, state)
    assert local.main(["down", f"--state={state}"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert sorted(p.name for p in state.iterdir()) == ["pids.json", "slurm.conf"]
    assert sleeper.poll() is None  # still running


@as_root
def test_down_refuses_a_marker_another_user_wrote(tmp_path):
    state = localconf.private_folder(tmp_path / "state")
    localconf.write_marker(state)
    (state / "slurm.conf").write_text("x\n")
    os.chown(state / localconf.MARKER, OTHER_UID, OTHER_UID)
    with pytest.raises(ValueError):
        local.down(state)
    os.chown(state / localconf.MARKER, os.geteuid(), os.getegid())
    data = json.loads((state / localconf.MARKER).read_text())
    (state / localconf.MARKER).unlink()
    localconf.write_secret(state / localconf.MARKER, json.dumps({**data, "uid": OTHER_UID}))
    with pytest.raises(ValueError):
        local.down(state)
    assert (state / "slurm.conf").exists()


def test_down_removes_the_folder_up_made(tmp_path):
    state = localconf.private_folder(tmp_path / "state")
    token = localconf.write_marker(state)
    assert len(token) >= 16 and token != localconf.write_marker(localconf.private_folder(tmp_path / "b"))
    assert json.loads((state / localconf.MARKER).read_text()) == {"uid": os.geteuid(), "token": token}
    (state / "slurm.conf").write_text("x\n")
    (state / "pids.json").write_text("{}")
    assert local.down(state) is True and not state.exists()
    assert local.down(state) is False  # nothing there: nothing to do


def test_status_reads_only_a_folder_up_made(tmp_path):
    """Its slurm.conf would steer sinfo (plugins and all): only ours is read."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "pids.json").write_text(json.dumps({"slurmd": os.getpid()}))
    with pytest.raises(ValueError):
        local.status(state)
