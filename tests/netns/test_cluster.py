"""The emulated cluster (network namespaces, shaped links), compute replay, the alpha-beta
fit and the model's predictions. Namespace tests need root and iproute2; elsewhere they
skip with the reason."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gtopk.perf import model as perfmodel
from gtopk.perf.netprofile import NetworkProfile, fit_alpha_beta
from gtopk.records import compute_profiles
from gtopk.reducers.costmodel import Network
from gtopk.run.cluster import ClusterError, EmulatedCluster, netns
from gtopk.run.cluster.emulated import rate_bits_per_s
from gtopk.run.spawn import WorkerError, spawn
from gtopk.train import compute
from tests import netns_workers
from tests.workers import Case, check_against_reference, fail_on_rank1

ROOT = Path(__file__).resolve().parents[2]
REASON = netns.unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"emulated cluster unavailable: {REASON}")


def ours() -> set[str]:
    return set(netns.existing())


# ------------------------------------------------------------------ fit and model
def test_alpha_beta_fit_recovers_synthetic_timings():
    alpha, beta = 2e-4, 8e-9
    sizes = [8, 1024, 65536, 1 << 20, 1 << 24]
    a, b = fit_alpha_beta(sizes, [alpha + beta * n for n in sizes])
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)
    noisy = [(alpha + beta * n) * (1.03 if i % 2 else 0.97) for i, n in enumerate(sizes)]
    a, b = fit_alpha_beta(sizes, noisy)
    assert a == pytest.approx(alpha, rel=0.1) and b == pytest.approx(beta, rel=0.1)
    # a shaper's burst: mid-sized messages run ahead of the rate; they must not bend the fit
    bursty = [alpha + beta * max(0, n - 65536) if 8192 < n < (1 << 20) else alpha + beta * n for n in sizes]
    a, b = fit_alpha_beta(sizes, bursty)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)
    # the burst also lets the small messages through at line rate: alpha is the smallest one's
    ahead = [alpha + (beta * n if n >= 65536 else 0.0) for n in sizes]
    a, b = fit_alpha_beta(sizes, ahead)
    assert a == pytest.approx(alpha, rel=1e-3) and b == pytest.approx(beta, rel=1e-6)
    # too few large sizes: one least-squares line through everything
    a, b = fit_alpha_beta([100, 200, 300], [1.1, 1.2, 1.3])
    assert a == pytest.approx(1.0) and b == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="two distinct"):
        fit_alpha_beta([8, 8], [1.0, 1.0])


def test_model_predictions_equal_hand_computed_values():
    net = Network(alpha=1e-3, beta=1e-8)
    m, k = 1_000_000, 1000  # density 0.001
    dense = {"_target_": "gtopk.reducers.DenseReducer", "bucket_mb": 100.0}  # one bucket
    # ring: 2(P-1) messages of m/P floats
    assert perfmodel.predict_commu(dense, 4, m, net) == pytest.approx(6 * (1e-3 + 250_000 * 4 * 1e-8))
    topk = {"_target_": "gtopk.reducers.TopKReducer", "density": 0.001, "reselect": False}
    # ring all-gather (gloo's): P - 1 latencies, (P-1) k entries of 8 bytes
    assert perfmodel.predict_commu(topk, 8, m, net) == pytest.approx(7e-3 + 7 * k * 8 * 1e-8)
    tree = {"_target_": "gtopk.reducers.GTopKReducer", "density": 0.001, "algorithm": "tree", "putback": "index"}
    # log2 P rounds up and log2 P down, k entries of 8 bytes each
    assert perfmodel.predict_commu(tree, 8, m, net) == pytest.approx(6 * (1e-3 + 8 * k * 1e-8))
    rd = dict(tree, algorithm="recursive_doubling")
    assert perfmodel.predict_commu(rd, 8, m, net) == pytest.approx(3 * (1e-3 + 8 * k * 1e-8))
    assert perfmodel.predict_commu(tree, 1, m, net) == 0.0
    local = {"t_data": 0.01, "t_compute": 0.1, "t_compr": 0.02, "t_update": 0.005}
    p = perfmodel.predict_iter(tree, 1024, m, net, local, images_per_iter=128)
    t_commu = 20 * (1e-3 + 8 * k * 1e-8)
    # the loop's non-finite check: gloo's ring all-reduce of 1,024 flags, 2 x 1,023 messages of 4 bytes
    check = 2 * 1023 * (1e-3 + 4 * 1e-8)
    assert p["t_commu"] == pytest.approx(t_commu) and p["t_check"] == pytest.approx(check)
    assert p["t_iter"] == pytest.approx(0.135 + t_commu + check)
    assert p["images_per_s_per_worker"] == pytest.approx(128 / (0.135 + t_commu + check))
    ddp = {"_target_": "baselines.ddp.DDPReducer", "bucket_mb": 100.0}  # overlaps backward
    p = perfmodel.predict_iter(ddp, 4, m, net, local, images_per_iter=128)
    # without the parameters' shapes the model knows no bucket's ready time: nothing hidden
    assert p["t_iter"] == pytest.approx(0.01 + 0.1 + p["t_commu"] + 6 * (1e-3 + 4 * 1e-8) + 0.02 + 0.005)
    assert p["t_exposed"] == pytest.approx(p["t_commu"])


def test_network_profile_round_trip(tmp_path):
    prof = NetworkProfile(alpha=1e-4, beta=8e-9, name="x", samples=[(8, 1e-4)])
    prof.save(tmp_path / "p.json")
    back = NetworkProfile.load(tmp_path / "p.json")
    assert back.network == Network(1e-4, 8e-9) and back.bits_per_s == pytest.approx(1e9)
    assert NetworkProfile.load("paper").network == Network.paper()
    with pytest.raises(FileNotFoundError, match="gtopk.perf.netbench"):
        NetworkProfile.load(tmp_path / "missing.json")


def test_rates_parse_in_tc_syntax():
    assert rate_bits_per_s("1gbit") == 1e9 and rate_bits_per_s("100mbit") == 1e8
    assert rate_bits_per_s("125mbps") == 1e9
    with pytest.raises(ClusterError, match="cluster.bandwidth"):
        EmulatedCluster(bandwidth="fast")


def test_emulated_cluster_that_cannot_be_built_suggests_alternatives(monkeypatch):
    failed = "`ip netns add x` failed: Operation not permitted"  # what the probe reports
    monkeypatch.setattr(netns, "unavailable_reason", lambda: failed)
    with pytest.raises(ClusterError, match="Operation not permitted.*cluster=local"):
        EmulatedCluster().check(2)


# ------------------------------------------------------------------ compute replay
def job_cfg(**over):
    base = {"model_name": "vgg16", "batch_size": 128, "grad_accum": 1, "device": "cpu", "mode": "benchmark"}
    base["benchmark"] = {"warmup": 3}
    return OmegaConf.create({**base, **over})


def test_p102_profile_is_the_papers_single_node_throughput():
    # throughput.csv: vgg16 at 1 node = 1317.333 images/s; resnet50 = 52.873 with 16 x 16 images
    assert compute.profile_t_compute("p102", job_cfg()) == pytest.approx(128 / 1317.333)
    cfg = job_cfg(model_name="resnet50", batch_size=16, grad_accum=16)
    assert compute.profile_t_compute("p102", cfg) == pytest.approx(256 / 52.873)
    with pytest.raises(compute.ProfileError, match="compute.profile=local"):
        compute.profile_t_compute("p102", job_cfg(model_name="mlp"))


def test_replay_refuses_training_and_reads_profile_files(tmp_path):
    with pytest.raises(compute.ProfileError, match="mode=benchmark"):
        compute.ReplayedCompute().resolve(job_cfg(mode="train"))
    path = tmp_path / "prof.json"
    path.write_text('{"vgg16/b128x1/cpu": {"images_per_s": 64.0}}')
    assert compute.ReplayedCompute(profile=str(path)).resolve(job_cfg()) == {"t_compute": 2.0, "warmup_steps": 3}
    with pytest.raises(compute.ProfileError, match="no entry"):
        compute.ReplayedCompute(profile=str(path)).resolve(job_cfg(batch_size=64))


# ------------------------------------------------------------------ namespaces
@needs_netns
def test_namespaces_are_built_shaped_and_removed():
    before = ours()
    with EmulatedCluster(bandwidth="200mbit", dilation=1).up(3) as placement:
        made = ours() - before
        assert len(made) == 4 and set(placement.namespaces) < made  # 3 ranks + the switch
        for ns in placement.namespaces:
            qdisc = subprocess.run(
                ["tc", "-n", ns, "qdisc", "show", "dev", "eth0"], capture_output=True, text=True
            ).stdout
            assert "tbf" in qdisc and "200Mbit" in qdisc
        views = spawn(netns_workers.where_am_i, 3, placement=placement)
        assert all(v["sees_own_address"] and v["master"] == "10.99.0.1" and v["ifname"] == "eth0" for v in views)
    assert ours() == before
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedCluster().up(2):
            raise RuntimeError("boom")
    assert ours() == before


@needs_netns
def test_link_is_shaped_to_its_rate():
    """Lower bound only (noise makes transfers slower, never faster than the shaper)."""
    nbytes = 2_000_000
    with EmulatedCluster(bandwidth="100mbit", burst="16kb").up(2) as placement:
        best = spawn(netns_workers.one_way_seconds, 2, (nbytes, 2), placement=placement)[0]
    assert best >= 0.85 * nbytes * 8 / 100e6


@needs_netns
@pytest.mark.parametrize(
    "case",
    [
        Case("dense", 5000),
        Case("topk", 5000, 0.01),
        Case("gtopk", 5000, 0.01, options={"algorithm": "tree"}),
        Case("gtopk", 5000, 0.01, options={"algorithm": "recursive_doubling"}),
    ],
    ids=lambda c: c.name,
)
def test_every_reducer_matches_the_reference_over_the_emulated_network(case):
    with EmulatedCluster().up(2) as placement:
        out = spawn(check_against_reference, 2, ([case],), placement=placement)
        sent = int(
            subprocess.run(
                ["ip", "-n", placement.namespaces[1], "-s", "-j", "link", "show", "eth0"],
                capture_output=True,
                text=True,
            )
            .stdout.split('"tx":{"bytes":')[1]
            .split(",")[0]
        )
    assert all(not o["failures"] for o in out), out[0]["failures"]
    assert sent > 0  # the traffic crossed the shaped link


@needs_netns
def test_killed_rank_leaves_no_namespaces_or_processes():
    before = ours()
    with pytest.raises(WorkerError):
        with EmulatedCluster().up(3) as placement:
            spawn(fail_on_rank1, 3, ("kill",), placement=placement, timeout=60, grace=2)
    assert ours() == before
    import multiprocessing

    assert not multiprocessing.active_children()


@needs_netns
def test_namespaces_go_away_when_the_owner_is_sigkilled(tmp_path):
    script = (
        "import sys, time\nfrom gtopk.run.cluster import EmulatedCluster\n"
        "with EmulatedCluster().up(2) as p:\n    print(' '.join(p.namespaces), flush=True)\n    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    names = proc.stdout.readline().split()
    assert len(names) == 2 and set(names) <= ours()
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 120  # polled: ends as soon as they are gone
    while set(names) & ours() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(names) & ours()


@needs_netns
def test_run_py_on_the_emulated_cluster_with_replayed_compute(tmp_path):
    env = dict(os.environ, WANDB_MODE="offline")
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            f"hydra.run.dir={tmp_path}",
            "cluster=emulated",
            "compute=replay",
            "compute.t_compute=0.02",
            "nodes=2",
            "reducer=gtopk",
            "batch_size=4",
            "benchmark.warmup=1",
            "benchmark.iters=2",
            "logger.wandb=false",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["cluster"] == "emulated" and s["compute"] == "replay" and s["t_compute_replayed"] == 0.02
    assert s["t_data"] == 0.0 and s["t_compute"] >= 0.02
    assert math.isfinite(s["t_commu"]) and s["bytes_sent_per_iter"] > 0


def test_local_profile_is_measured_once_at_p1_and_cached(tmp_path, monkeypatch, compose):
    """Workers never measure (MissingLocalProfile); the job, before its workers start,
    measures at P = 1 through the runner (gtopk.run.measure_compute) and then reads the cache."""
    import json

    from gtopk.run import execute

    monkeypatch.setattr(compute_profiles, "LOCAL_PROFILE", tmp_path / "profiles" / "local.json")
    overrides = ["compute=replay", "compute.profile=local", "batch_size=4", "logger.wandb=false", "nodes=4"]
    cfg = compose(overrides)
    with pytest.raises(compute.MissingLocalProfile):
        compute.profile_t_compute("local", cfg)
    execute.resolve_compute(cfg)
    t = cfg.compute.t_compute
    entry = json.loads((tmp_path / "profiles" / "local.json").read_text())["resnet20/b4x1/" + cfg.device]
    assert t == pytest.approx(4 / entry["images_per_s"]) and entry["t_compute"] == pytest.approx(t)
    assert json.loads((Path(entry["run_dir"]) / "summary.json").read_text())["nodes"] == 1
    monkeypatch.setattr(execute, "measure_local", lambda cfg: pytest.fail("measured twice"))
    again = compose(overrides)
    execute.resolve_compute(again)
    assert again.compute.t_compute == t
