"""SLURM for real: a single-node cluster on this machine (``python -m gtopk.run.slurm.local``),
a sweep submitted through ``hydra/launcher=submitit_slurm`` (one SLURM job per Hydra job,
results in the usual run directories, failed jobs listed, finished jobs skipped on a
re-run), and ``gtopk/run/slurm/torchrun.sbatch`` (srun + torchrun) on one node. Skips with
the reason when SLURM is not installed and cannot be (not root, no apt: ``up`` exits 3); any
other failure to bring it up fails. The cluster's guards (private state folder, 0600
secrets, the database's password, ``down`` only on a marked folder) are unit tested in
``tests/unit/test_slurm_local.py``; here they are checked on the real daemons."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtopk.records.rundir import read_jsonl
from gtopk.run.slurm import TORCHRUN_SBATCH
from gtopk.run.slurm.local import client_env
from gtopk.run.slurm.localconf import MARKER, tool
from gtopk.run.supervise import alive
from tests.procs import FAST, run

#: slow: bringing SLURM up may first apt-get install its daemons (minutes on a fresh CI machine)
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LOCAL = [sys.executable, "-m", "gtopk.run.slurm.local"]
#: the override dirname of the FAST settings at nodes=2 (logger.wandb is excluded from it)
DIRNAME = "batch_size=4,benchmark.iters=2,benchmark.warmup=1,data.train_size=64,nodes=2,reducer={}"


def local(action: str, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*LOCAL, action, f"--state={state}"], capture_output=True, text=True, timeout=600)


def up(state: Path) -> None:
    """Bring a cluster up in ``state`` (a short path: sockets live there, so not pytest's
    deep tmp); skip if SLURM cannot be installed here."""
    done = local("up", state)
    if done.returncode == 3:
        pytest.skip(f"SLURM cannot start here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def slurm() -> Iterator[Path]:
    """A running single-node cluster; yields its state directory (SLURM_CONF is inside)."""
    state = Path(f"/tmp/gtk-slurm-{os.getpid()}")
    up(state)
    yield state
    local("down", state)


def sacct_states(state: Path, job_ids: list[str], timeout: float = 60.0) -> dict[str, str]:
    """The jobs' states in SLURM's accounting, once every one has ended (slurmctld reports
    to slurmdbd a moment after the job's result file is written)."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(job_ids)],
            env=client_env(state),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        states = dict(line.split("|", 1) for line in out.splitlines() if line)
        ended = set(job_ids) <= set(states) and not {"PENDING", "RUNNING", "COMPLETING"} & set(states.values())
        if ended or time.monotonic() > deadline:
            return states
        time.sleep(0.2)


def test_local_cluster_comes_up_idle_and_goes_down(tmp_path):
    state = Path(f"/tmp/gtk-slurm-updown-{os.getpid()}")
    up(state)
    try:
        pids = json.loads((state / "pids.json").read_text())
        assert set(pids) == {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd"}
        assert local("status", state).returncode == 0
        sinfo = subprocess.run(["sinfo", "-h", "-o", "%P %T %c"], env=client_env(state), capture_output=True, text=True)
        assert sinfo.stdout.split() == ["local*", "idle", str(os.cpu_count())]  # this host's real CPUs
        assert stat.S_IMODE(os.stat(state).st_mode) == 0o700  # only its owner reaches the sockets inside
        for secret in ("munge/munge.key", "slurmdbd.conf", "mariadb.pass", MARKER):
            assert stat.S_IMODE(os.stat(state / secret).st_mode) == 0o600, secret
        dbd = dict(ln.split("=", 1) for ln in (state / "slurmdbd.conf").read_text().splitlines() if "=" in ln)
        assert dbd["StoragePass"] == (state / "mariadb.pass").read_text().strip() != ""
        if tool("mariadb"):  # root has no password to give over TCP: only the unix socket, as this user
            port = ["-h127.0.0.1", f"-P{dbd['StoragePort']}"]
            root = subprocess.run(["mariadb", "--no-defaults", *port, "-uroot", "-e", "select 1"], capture_output=True)
            assert root.returncode != 0
    finally:
        assert local("down", state).returncode == 0
    assert not state.exists()
    assert not [pid for pid in pids.values() if alive(pid)], pids
    assert local("status", state).returncode == 1


@pytest.mark.slow
def test_sweep_runs_as_slurm_jobs_lists_failures_and_resumes(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm / "slurm.conf"))
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=submitit_slurm", "nodes=2", *FAST, f"hydra.sweep.dir={sweep}"]
    first = run(*args, "reducer=dense,gtopk", timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    ids = re.findall(r"SLURM job (\S+):", first.stdout)
    assert len(ids) == 2 and set(sacct_states(slurm, ids).values()) == {"COMPLETED"}, first.stdout
    for reducer in ("dense", "gtopk"):  # the run directory a local sweep uses
        summary = json.loads((sweep / DIRNAME.format(reducer) / "summary.json").read_text())
        assert summary["nodes"] == 2 and summary["reducer"] == reducer
        assert len(read_jsonl(sweep / DIRNAME.format(reducer) / "iters.rank1.jsonl")) == 3

    # a failing job (topk) is listed like a local failure; the finished ones are not resubmitted
    failing = run(*args, "reducer=dense,gtopk,topk", "fault.kind=raise", "fault.rank=1", timeout=600)
    assert failing.returncode == 1, failing.stderr[-3000:]
    assert failing.stdout.count("skipping") == 2 and len(re.findall(r"SLURM job (\S+):", failing.stdout)) == 1
    (failed_id,) = re.findall(r"SLURM job (\S+):", failing.stdout)
    assert sacct_states(slurm, [failed_id])[failed_id] == "FAILED"  # the job itself exited non-zero
    listing = failing.stderr[failing.stderr.index("1 of 3 job(s) did not finish") :]
    assert f"{sweep / DIRNAME.format('topk')}: SLURM job {failed_id}: rank 1:" in listing
    assert "InjectedFault" in listing and "[log: " in listing
    assert not (sweep / DIRNAME.format("topk") / "summary.json").exists()
    assert (sweep / DIRNAME.format("topk") / "failed.json").exists()

    again = run(*args, "reducer=dense,gtopk,topk", timeout=600)  # retries only the failed job
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipping") == 2 and len(re.findall(r"SLURM job (\S+):", again.stdout)) == 1
    assert (sweep / DIRNAME.format("topk") / "summary.json").exists()
    assert not (sweep / DIRNAME.format("topk") / "failed.json").exists()


def test_torchrun_batch_script_runs_one_job_over_srun_and_torchrun(slurm, tmp_path):
    """The command docs/distributed.md shows, on one node with two ranks."""
    run_dir = tmp_path / "run"
    env = client_env(slurm)
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", NPROC_PER_NODE="2")
    done = subprocess.run(
        ["sbatch", "--wait", "--nodes=1", f"--output={tmp_path / 'job.out'}", str(TORCHRUN_SBATCH)]
        + ["reducer=gtopk", *FAST, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert done.returncode == 0, done.stderr + log[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["nodes"] == 2 and summary["iterations"] == 4
    assert sorted(p.name for p in run_dir.glob("iters.rank*.jsonl")) == ["iters.rank0.jsonl", "iters.rank1.jsonl"]
    assert "1 node(s) x 2 rank(s) = 2" in log
