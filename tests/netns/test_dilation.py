"""The dilated emulated cluster as built (root, iproute2, a cgroup CPU controller): links
shaped to bandwidth / D, one CPU-capped cgroup per rank that its worker joins, limits D
times as long, records in virtual time, and nothing left behind, a SIGKILLed owner
included. Elsewhere these skip with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtopk import host
from gtopk.run.cluster import EmulatedCluster, cpucap, netns
from gtopk.run.pool import WorkerGroup
from gtopk.run.spawn import spawn
from tests.netns import dilation_workers

ROOT = Path(__file__).resolve().parents[2]
REASON = netns.unavailable_reason() or cpucap.unavailable_reason(netns.PREFIX)
needs_caps = pytest.mark.skipif(REASON is not None, reason=f"dilated emulated cluster unavailable: {REASON}")


def groups() -> set[str]:
    return set(cpucap.existing(netns.PREFIX))


@needs_caps
def test_dilated_links_and_cpu_caps_are_built_and_removed():
    before_ns, before_cg = set(netns.existing()), groups()
    with EmulatedCluster(bandwidth="1gbit", latency="10ms", dilation=4).up(2, threads=1) as placement:
        assert placement.dilation == 4 and len(placement.cpu_groups) == 2
        for ns, path in zip(placement.namespaces, placement.cpu_groups):
            qdisc = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", "eth0"], capture_output=True, text=True)
            assert "rate 250Mbit" in qdisc.stdout and "lat 40ms" in qdisc.stdout, qdisc.stdout
            assert Path(path).name == ns  # a rank's cgroup has its namespace's name
            cg = Path(path)
            if (cg / "cpu.max").exists():
                assert (cg / "cpu.max").read_text().split() == ["5000", "20000"]
            else:
                assert (cg / "cpu.cfs_quota_us").read_text().strip() == "5000"
                assert (cg / "cpu.cfs_period_us").read_text().strip() == "20000"
    assert set(netns.existing()) == before_ns and groups() == before_cg
    with EmulatedCluster(dilation=1).up(2, threads=1) as placement:  # real time: no caps
        assert placement.dilation == 1 and placement.cpu_groups == ()


@needs_caps
@pytest.mark.slow
def test_cgroups_go_away_when_the_owner_is_sigkilled():
    script = (
        "import time\nfrom gtopk.run.cluster import EmulatedCluster\n"
        "with EmulatedCluster(dilation=2).up(2, threads=1) as p:\n"
        "    print(' '.join(p.namespaces), flush=True)\n    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    names = proc.stdout.readline().split()
    assert len(names) == 2 and set(names) <= groups()
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 120  # polled: ends as soon as they are gone
    while set(names) & (groups() | set(netns.existing())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(names) & (groups() | set(netns.existing()))


@needs_caps
@pytest.mark.slow
def test_workers_run_capped_in_virtual_time_with_d_times_the_limits():
    with EmulatedCluster(dilation=3).up(2, threads=1) as placement:
        views = spawn(dilation_workers.where_and_when, 2, placement=placement)
        for rank, v in enumerate(views):
            assert v["dilation"] == 3 and v["env"] == "3"
            assert Path(placement.cpu_groups[rank]).name in v["cgroup"]
        with WorkerGroup(1, timeout=50, placement=placement, collective_timeout=20) as group:
            assert (group.timeout, group.collective_timeout, group.startup_timeout) == (150, 60, 900)


@needs_caps
@pytest.mark.slow
def test_a_dilated_job_records_virtual_times(tmp_path):
    argv = ["cluster=emulated", "cluster.dilation=4", "compute=replay", "compute.t_compute=0.05", "nodes=2"]
    argv += ["reducer=gtopk", "batch_size=4", "benchmark.warmup=1", "benchmark.iters=3", "logger.wandb=false"]
    env = dict(os.environ, WANDB_MODE="offline")
    out = subprocess.run(
        [sys.executable, "run.py", f"hydra.run.dir={tmp_path}", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["time_base"] == "dilated" and s["dilation"] == 4 and s["bandwidth"] == "1gbit"
    # the replayed compute slept 0.2 s of wall per step: 0.05 s in the records (never less)
    assert 0.05 <= s["t_compute"] < 0.2
    rows = [json.loads(line) for line in (tmp_path / "iters.rank0.jsonl").read_text().splitlines()]
    assert rows and all(r["dilation"] == 4 for r in rows)
    assert host.DILATION_ENV not in os.environ  # the launcher itself runs in real time
