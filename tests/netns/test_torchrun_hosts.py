"""torchrun across hosts, for real: two hosts emulated as network namespaces (the emulated
cluster's rank namespaces, ``EmulatedCluster.up(2)``: one shaped 1 Gbit/s link each, joined
by a bridge), each running ``torchrun --nnodes=2 --nproc-per-node=2`` with the c10d
rendezvous on host 0's address. The job's records are complete, a sparse reducer's final
weights equal those of the same job spawned on one host, and a host killed mid-job makes
the other host's torchrun exit non-zero, leaving no process behind.

What a namespace host needs that a real one does not (docs/distributed.md): its hostname
is the machine's and does not resolve to its address, so the rendezvous endpoint is host
0's address, host 0 is told it hosts the store (``--rdzv-conf=is_host=1``), every host
advertises its own address (``--local-addr``), and gloo is pointed at the namespace's
interface (``GLOO_SOCKET_IFNAME``, from the placement's env)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtopk.records.rundir import read_jsonl
from gtopk.run.cluster import EmulatedCluster, Placement, netns
from gtopk.run.cluster.emulated import address
from tests.procs import FAST, run

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"
REASON = netns.unavailable_reason()
pytestmark = [
    pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}"),
    pytest.mark.slow,  # ~35 s together: make test-slow (CI runs it)
]
HOSTS, PER_HOST = 2, 2
RDZV_PORT = 29400  # inside the job's own namespaces: no clash with anything else


def torchrun_hosts(placement: Placement, log_dir: Path, rdzv_id: str, *overrides: str) -> list[subprocess.Popen]:
    """Start one ``torchrun`` per host namespace, each in its own session."""
    procs = []
    for h, ns in enumerate(placement.namespaces):
        cmd = [
            *("ip", "netns", "exec", ns, str(TORCHRUN)),
            f"--nnodes={HOSTS}",
            f"--nproc-per-node={PER_HOST}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={address(0)}:{RDZV_PORT}",
            f"--rdzv-id={rdzv_id}",
            f"--local-addr={address(h)}",
            *(["--rdzv-conf=is_host=1"] if h == 0 else []),
            str(ROOT / "run.py"),
            f"nodes={HOSTS * PER_HOST}",
            *overrides,
        ]
        env = dict(os.environ, **placement.env, WANDB_MODE="offline", WANDB_SILENT="true")
        out = open(log_dir / f"host{h}.log", "w")  # noqa: SIM115 - closed with the process below
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        )
        out.close()
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"a torchrun did not exit within {timeout}s") from None
    return [p.returncode for p in procs]


def wait_namespaces_empty(names: tuple[str, ...], timeout: float = 60.0) -> list[int]:
    """Poll until no process runs in ``names`` (returns []), or what is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := [pid for ns in names for pid in netns.pids_in(ns)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def logs(log_dir: Path) -> str:
    return "\n".join(f"--- {p.name} ---\n{p.read_text()[-2500:]}" for p in sorted(log_dir.glob("host*.log")))


@pytest.mark.parametrize("reducer", [pytest.param("topk", marks=pytest.mark.slow), "gtopk"])  # ~50 s each
def test_two_hosts_give_the_records_and_weights_of_one_host(tmp_path, reducer):
    settings = [f"reducer={reducer}", *FAST]
    one = run(f"nodes={HOSTS * PER_HOST}", *settings, f"hydra.run.dir={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr[-3000:]
    run_dir = tmp_path / "two"
    with EmulatedCluster(bandwidth="1gbit").up(HOSTS) as placement:
        codes = wait_all(
            torchrun_hosts(placement, tmp_path, f"eq-{reducer}", *settings, f"hydra.run.dir={run_dir}"), 600
        )
        assert codes == [0, 0], logs(tmp_path)
        assert wait_namespaces_empty(placement.namespaces) == []
    assert not set(placement.namespaces) & set(netns.existing())
    world = HOSTS * PER_HOST
    assert sorted(p.name for p in run_dir.glob("iters.rank*.jsonl")) == [f"iters.rank{r}.jsonl" for r in range(world)]
    for r in range(world):
        rows = read_jsonl(run_dir / f"iters.rank{r}.jsonl")
        assert [row["iter"] for row in rows] == [0, 1, 2] and {row["rank"] for row in rows} == {r}
    two, single = (json.loads((d / "summary.json").read_text()) for d in (run_dir, tmp_path / "one"))
    assert two["nodes"] == world and two["iterations"] == world * 2 and two["backend"] == "gloo"
    assert len({row["pid"] for r in range(world) for row in read_jsonl(run_dir / f"iters.rank{r}.jsonl")}) == world
    assert two["weights_sha256"] == single["weights_sha256"]


def test_a_killed_host_ends_the_job_on_every_host(tmp_path):
    run_dir = tmp_path / "run"
    settings = ["reducer=gtopk", *FAST, "benchmark.iters=100000", "collective_timeout_s=60", "timeout_s=120"]
    with EmulatedCluster(bandwidth="1gbit").up(HOSTS) as placement:
        procs = torchrun_hosts(placement, tmp_path, "kill", *settings, f"hydra.run.dir={run_dir}")
        try:
            deadline = time.monotonic() + 300
            world = HOSTS * PER_HOST
            while not all(read_jsonl(run_dir / f"iters.rank{r}.jsonl") for r in range(world)):  # every rank stepping
                assert all(p.poll() is None for p in procs), logs(tmp_path)
                assert time.monotonic() < deadline, "the job did not start on every rank\n" + logs(tmp_path)
                time.sleep(0.1)
            host1 = netns.pids_in(placement.namespaces[1])  # its torchrun and the ranks it started
            assert procs[1].pid in host1 and len(host1) >= 1 + PER_HOST, host1
            for pid in host1:
                os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            codes = wait_all(procs, 300)  # bounded: collective_timeout_s at worst, generously
            took = time.monotonic() - killed
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        assert codes[1] == -signal.SIGKILL and codes[0] != 0, (codes, logs(tmp_path))
        assert wait_namespaces_empty(placement.namespaces) == [], "processes left on a host"
    print(f"host 0's torchrun exited {codes[0]} {took:.1f}s after host 1 was killed")
    assert not set(placement.namespaces) & set(netns.existing())
    assert not (run_dir / "summary.json").exists()
    failed = json.loads((run_dir / "failed.json").read_text())
    assert failed["error"], failed
