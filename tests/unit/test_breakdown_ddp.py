"""The breakdown draws DDP's bar from its recorded t_commu (the all-reduce time backward
could not hide), not inside compute; hand-made records, hand-computed bars."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.figures import breakdown
from gtopk.perf.netprofile import NetworkProfile

DDP = {"_target_": "baselines.ddp.DDPReducer", "bucket_mb": 25.0}
M, BATCH = 1_000_000, 100  # one 4 MB bucket
#: P -> the DDP job's times: at P = 2, 0.030 s of its 0.070 s all-reduce was not hidden
TIMES = {
    1: {"t_data": 0.001, "t_compute": 0.080, "t_commu": 0.0, "t_commu_backward": 0.0, "t_iter": 0.090},
    2: {"t_data": 0.001, "t_compute": 0.080, "t_commu": 0.030, "t_commu_backward": 0.070, "t_iter": 0.120},
}


def write_ddp_job(root: Path, P: int) -> None:
    d = root / f"nodes={P},reducer=ddp"
    d.mkdir(parents=True)
    cfg = {"name": "bd", "reducer": DDP, "reducer_name": "ddp", "model_name": "resnet20", "nodes": P}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    t = TIMES[P]
    summary = {
        "reducer": "ddp",
        "model": "resnet20",
        "nodes": P,
        "density": 0.001,
        "params": M,
        "mode": "benchmark",
        "batch_per_worker": BATCH,
        "grad_accum_steps": 1,
        "cluster": "emulated",
        "compute": "replay",
        "t_compr": 0.0,
        "t_update": t["t_iter"] - t["t_data"] - t["t_compute"] - t["t_commu"],
        **t,
        "images_per_s_per_worker": BATCH / t["t_iter"],
        "env": {"cpu": "test", "host": "h", "git_commit": "x"},
    }
    (d / "summary.json").write_text(json.dumps(summary))


def test_ddp_bar_takes_its_communication_from_t_commu(tmp_path):
    root = tmp_path / "bd"
    for P in TIMES:
        write_ddp_job(root, P)
    net = NetworkProfile(alpha=1e-3, beta=1e-8, name="test")  # 1 ms per message, 100 MB/s
    net.save(tmp_path / "profile.json")
    breakdown.main([str(root), "--network", str(tmp_path / "profile.json")])
    bars = pd.read_csv(root / "analysis" / "breakdown.csv").set_index(["kind", "reducer"])

    measured = bars.loc[("measured", "ddp")]
    assert measured["nodes"] == 2
    assert measured["t_compute"] == pytest.approx(0.080)  # backward's compute only
    assert measured["t_commu"] == pytest.approx(0.030)  # the all-reduce backward did not hide
    assert measured["t_other"] == pytest.approx(0.010)  # update 0.009 + data 0.001
    assert measured["t_commu_backward"] == pytest.approx(0.070)

    # P = 32: the model's buckets are DDP's over ResNet-20's layers (conf/model): its 269,722
    # parameters are one 25 MB bucket, a ring of 2 * 31 messages of ceil(269,722 / 32) = 8,429
    # floats = 62 * (1 ms + 0.337 ms); the bucket holds the first layer, ready only when
    # backward ends, so none of it is hidden
    modelled = bars.loc[("modelled", "ddp")]
    allreduce = 62 * (1e-3 + 4 * 8_429 * 1e-8)
    assert modelled["t_commu_total"] == pytest.approx(allreduce)
    check = 62 * (1e-3 + 4 * 1e-8)  # the loop's non-finite check: a ring all-reduce of 32 flags
    # the communication the step waits for: what sticks out of backward (all of it) and the check
    assert modelled["t_commu"] == pytest.approx(allreduce + check)
    assert modelled["t_iter"] == pytest.approx(0.001 + 0.080 + allreduce + check + 0.009)
    # each part against its hand-computed value (t_commu is the remainder of t_iter in the
    # model, so the parts' sum alone would restate it): backward's compute as measured,
    # nothing compressed, update 0.009 + data 0.001
    assert modelled["t_compute"] == pytest.approx(0.080)
    assert modelled["t_compr"] == pytest.approx(0.0)
    assert modelled["t_other"] == pytest.approx(0.010)
