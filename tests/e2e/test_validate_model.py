"""`make validate-model` end to end, cut down (P = 1, 2; gTop-k and DDP; a short ping-pong):
a calibration at each bandwidth of the experiment, the benchmark sweep, the ratio table and
the offline wandb export. Needs the emulated cluster (root, ip, tc): its bandwidths are the
point, so there is no loopback fallback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from gtopk.perf.netprofile import NetworkProfile
from gtopk.run.cluster.netns import unavailable_reason
from tests.e2e.test_reproduce import make

TINY = "nodes=1,2 reducer=gtopk,ddp benchmark.iters=2 benchmark.min_iters=1"


@pytest.mark.slow  # ~60 s: two calibrations and eight jobs on shaped links
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"needs the emulated cluster: {unavailable_reason()}")
def test_validate_model_smoke(tmp_path: Path):
    runs, wandb_dir = tmp_path / "validation", tmp_path / "wandb"
    log = make("validate-model", runs, wandb_dir, TINY)
    assert f"Outputs in {runs / 'analysis'}/: validation.{{csv,md}}" in log
    profiles = {NetworkProfile.load(p).cluster["bandwidth"]: p for p in runs.glob("net/*/profile.json")}
    assert set(profiles) == {"100mbit", "1gbit"}
    df = pd.read_csv(runs / "analysis" / "validation.csv")
    assert sorted(zip(df["bandwidth"], df["nodes"], df["reducer"])) == [
        ("100mbit", 2, "ddp"),
        ("100mbit", 2, "gtopk"),
        ("1gbit", 2, "ddp"),
        ("1gbit", 2, "gtopk"),
    ]
    assert (df["t_iter_measured"] > 0).all() and (df["t_commu_measured"] > 0).all()
    assert (df["software_s"] >= 0).all()  # each calibration measured the sparse rounds' software cost
    assert "| 100mbit | resnet20 | 2 | gtopk |" in (runs / "analysis" / "validation.md").read_text()
    assert "8 job run(s) and 1 analysis run(s) exported (offline)" in log
