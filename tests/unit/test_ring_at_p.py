"""The ring step measured with P ranks up (``NetworkProfile.ring_alpha_at``): which one the
model takes at a P, that it reaches every prediction made at that P (``compare``, the
modelled lines of Fig. 6, the validation), and the calibration that measures it at every P
of a sweep (``analysis.reproduce.steps``). Hand-computed numbers throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.payoff.itertime import networks
from analysis.reproduce import steps
from analysis.scaling import modelled
from gtopk.perf.model import compare
from gtopk.perf.netprofile import NetworkProfile

DENSE = {"_target_": "gtopk.reducers.DenseReducer", "bucket_mb": 25.0}
AT = {"2": 1e-4, "8": 3e-4, "32": 2e-4}


def profile(at: dict | None = None) -> NetworkProfile:
    return NetworkProfile(alpha=5e-5, beta=1e-9, ring_alpha=1e-4, ring_alpha_at=dict(AT if at is None else at))


@pytest.mark.parametrize(
    "P, step",
    [
        (8, 3e-4),  # measured there
        (2, 1e-4),
        (1, 1e-4),  # nearest: 2
        (3, 1e-4),  # log2 3 = 1.58: nearer 2 than 8
        (4, 3e-4),  # as far from 2 as from 8: the larger
        (16, 2e-4),  # as far from 8 as from 32: the larger
        (64, 2e-4),  # beyond the largest measured: the largest's
        (1024, 2e-4),
    ],
)
def test_the_ring_step_at_P_is_the_nearest_measured(P, step):
    assert profile().ring_step(P) == step
    assert profile().network_at(P).ring_alpha == step
    assert profile().network_at(P).alpha == 5e-5  # nothing else changes


def test_without_steps_at_P_every_P_gets_the_pairs():
    p = profile({})
    assert p.ring_step(32) == 1e-4 and p.network_at(32) == p.network


def test_the_steps_survive_a_save_and_a_load(tmp_path):
    profile().save(tmp_path / "profile.json")
    back = NetworkProfile.load(tmp_path / "profile.json")
    assert back.ring_alpha_at == AT and back.ring_step(8) == 3e-4


def test_compare_on_a_profile_models_the_job_at_its_P():
    # dense, P = 8, m = 8,000 (one bucket): 14 ring steps of 1,000 x 4 bytes, and the check's
    # all-reduce of 8 flags: 14 steps of 4 bytes; the ring step at 8 is 3e-4
    summary = {"nodes": 8, "params": 8000, "batch_per_worker": 10, "grad_accum_steps": 1, "model": "resnet20"}
    summary |= {"t_commu": 0.01, "t_iter": 0.1, "t_compute": 0.02}
    out = compare(summary, {"reducer": DENSE}, profile())
    assert out["t_commu_predicted"] == pytest.approx(14 * (3e-4 + 4000e-9))
    assert out["t_iter_predicted"] == pytest.approx(0.02 + 14 * (3e-4 + 4000e-9) + 14 * (3e-4 + 4e-9))


def test_the_modelled_line_takes_each_Ps_step():
    job = {
        "name": "fig6", "cluster": "emulated", "compute": "replay", "model": "resnet20", "batch_per_worker": 10,
        "grad_accum_steps": 1, "density": None, "reducer": "dense", "reducer_cfg": DENSE, "nodes": 1,
        "params": 8000, "images_per_iter": 10, "t_iter": 0.02, "t_data": 0.0, "t_compute": 0.02,
        "t_compr": 0.0, "t_update": 0.0, "t_commu": 0.0, "images_per_s_per_worker": 500.0,
    }  # fmt: skip
    rows = modelled(pd.DataFrame([job]), profile(), nodes=[4, 8, 64])
    commu = dict(zip(rows["nodes"], rows["t_commu"]))
    assert commu[8] == pytest.approx(14 * (3e-4 + 4000e-9))
    assert commu[4] == pytest.approx(6 * (3e-4 + 8000e-9))  # a tie between 2 and 8: 8's step
    assert commu[64] == pytest.approx(126 * (2e-4 + 500e-9))  # 125 entries per chunk


def test_the_payoff_sweep_carries_the_calibrated_steps():
    swept = networks([profile()])[-1]
    assert not swept.calibrated and swept.profile.ring_step(8) == 3e-4


def test_calibration_measures_the_step_at_every_P_of_the_sweep(tmp_path, monkeypatch):
    ran: list[list[str]] = []

    def fake_run(cmd: list[str]) -> None:
        ran.append(cmd)
        out = next(c.split("=", 1)[1] for c in cmd if c.startswith("out="))
        nodes = next(c.split("=", 1)[1] for c in cmd if c.startswith("ring.nodes="))
        at = {P: 1e-4 for P in nodes.strip("[]").split(",") if P}
        NetworkProfile(alpha=1e-4, beta=1e-9, ring_alpha_at=at).save(Path(out) / "profile.json")

    monkeypatch.setattr(steps, "run", fake_run)
    base = ["experiment=fig6_reproduce", f"hydra.sweep.dir={tmp_path}/sweep", "cluster=local"]
    _, net = steps.calibrate(base + ["nodes=1,2,4"], [])
    assert len(ran) == 1 and "ring.nodes=[2,4]" in ran[0]
    steps.calibrate(base + ["nodes=2,4"], [])  # covered: not measured again
    assert len(ran) == 1
    steps.calibrate(base + ["nodes=1,2,4,8,16"], [])  # 8 and 16 missing: measured again, all of them
    assert len(ran) == 2 and "ring.nodes=[2,4,8,16]" in ran[1]
    assert set(json.loads((net / "profile.json").read_text())["ring_alpha_at"]) == {"2", "4", "8", "16"}
    steps.calibrate(base + ["nodes=1,2,4"], [], beyond=[32])  # --full's P beyond the sweep's
    assert len(ran) == 3 and "ring.nodes=[2,4,32]" in ran[2]
