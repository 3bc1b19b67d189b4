"""``python -m gtopk.perf.netbench`` end to end on loopback: profile, collectives.csv columns."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest


@pytest.mark.slow  # ~15 s; make reproduce-fig6's test runs netbench too
def test_netbench_writes_profile_and_collectives(tmp_path):
    out = tmp_path / "net"
    cmd = [
        sys.executable,
        "-m",
        "gtopk.perf.netbench",
        "cluster=local",
        f"out={out}",
        "name=loopback",
        "pingpong.sizes=[8,65536,1048576]",
        "pingpong.reps=2",
        "collectives.nodes=[3]",
        "collectives.m=[20000]",
        "collectives.iters=2",
        "collectives.latency_reps=2",
        "software.samples=5",
        "ring.nodes=[2,3]",
        "ring.reps=3",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "profile.json").exists() and (out / "pingpong.csv").exists()
    profile = json.loads((out / "profile.json").read_text())
    assert profile["backend"] == "gloo"  # backend=auto on a CPU, as training
    # the sparse rounds' software cost: one sample per timed reduce, the median clipped at 0
    assert len(profile["software_samples"]) == 5 and profile["software"] >= 0
    assert "P = 2" in profile["software_notes"] and "software cost per sparse message" in done.stdout
    # a step of gloo's own ring (its all-reduce of the two ranks' flags), measured
    assert profile["ring_alpha"] > 0 and "ring step" in done.stdout
    # and with P ranks up: P = 2 is the pair's, P = 3 a group of its own
    assert set(profile["ring_alpha_at"]) == {"2", "3"} and profile["ring_alpha_at"]["2"] == profile["ring_alpha"]
    assert profile["ring_alpha_at"]["3"] > 0 and "P = 3" in done.stdout
    rows = pd.read_csv(out / "collectives.csv").set_index("reducer")
    assert set(rows.index) == {"dense", "topk", "gtopk_tree", "gtopk_rd"}
    assert (rows["nodes"] == 3).all() and (rows["m"] == 20000).all()
    # the collective's span (last start to last end) never exceeds the slowest rank's own
    # time by more than clock noise, and is positive; every model column is filled
    assert (rows["t_commu"] > 0).all()
    assert (rows["t_commu"] <= rows["t_commu_slowest"] + 1e-3).all()
    assert (rows["t_commu_min"] <= rows["t_commu_slowest"]).all()
    assert (rows["rd_latency"] > 0).all() and rows["alpha_at_P"].notna().all()
    assert (rows["t_commu_model"] > 0).all() and (rows["t_commu_model_at_P"] > 0).all()
    assert rows.loc["gtopk_tree", "t_merge"] > 0 and rows.loc["dense", "t_merge"] == 0
    assert rows.loc["gtopk_rd", "messages_sent"] > 0
    assert rows["software_t_commu"].notna().all() and rows["software_at_P"].notna().all()
    assert "ratio" in done.stdout and "alpha at P" in done.stdout
