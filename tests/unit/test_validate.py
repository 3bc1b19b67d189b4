"""analysis.payoff.validate: the payoff's modelled t_iter against measured jobs, on hand-built
records with a hand-worked prediction."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.payoff import validate
from gtopk.perf.netprofile import NetworkProfile
from tests.wandb_records import write_job

P102_RESNET20 = 920.632  # images/s, the paper's single-P102 ResNet-20 throughput (gtopk/paper/throughput.csv)


def job(root, nodes: int, bandwidth: str, **times) -> None:
    summary = {
        "mode": "benchmark",
        "model": "resnet20",
        "reducer": "dense",
        "nodes": nodes,
        "params": 1000,
        "batch_per_worker": 32,
        "grad_accum_steps": 1,
        "compute": "replay",
        "compute_profile": "p102",
        "cluster": "emulated",
        "bandwidth": bandwidth,
        **times,
    }
    over = ["experiment=model_validation", f"nodes={nodes}", "reducer=dense", f"cluster.bandwidth={bandwidth}"]
    write_job(root / f"bw={bandwidth},nodes={nodes}", over, {}, summary)


def test_prediction_is_the_payoffs_model_and_the_ratio_is_against_the_job(tmp_path):
    root = tmp_path / "model_validation"
    # P = 1: the model's inputs. Its rest of the step, t_commu included (local at P = 1):
    # 0.050 - 0.001 - 0.0348 - 0 = 0.0142 s
    job(root, 1, "100mbit", t_iter=0.050, t_data=0.001, t_compute=0.0348, t_compr=0.0, t_commu=0.002)
    job(root, 4, "100mbit", t_iter=0.080, t_data=0.001, t_compute=0.0348, t_compr=0.0, t_commu=0.030)
    job(root, 4, "1gbit", t_iter=0.060, t_data=0.001, t_compute=0.0348, t_compr=0.0, t_commu=0.010)  # no profile given
    profile = tmp_path / "net" / "profile.json"
    NetworkProfile(
        alpha=1e-3, beta=1e-6, name="emulated", cluster={"cluster": "emulated", "bandwidth": "100mbit"}
    ).save(profile)
    validate.main([str(root), "--network", str(profile)])
    df = pd.read_csv(root / "analysis" / "validation.csv")
    assert len(df) == 1  # P = 1 is an input; the 1 Gbit/s job matches no given profile
    row = df.iloc[0]
    # ring all-reduce of 1000 floats at P = 4: 2 (P - 1) messages of 250 x 4 bytes
    t_commu = 2 * 3 * (1e-3 + 1000 * 1e-6)
    # the loop's non-finite check: a ring all-reduce of 4 flags, 2 (P - 1) messages of 1 x 4 bytes
    t_check = 2 * 3 * (1e-3 + 4 * 1e-6)
    t_iter = 0.001 + 32 / P102_RESNET20 + t_commu + t_check + 0.0 + (0.050 - 0.001 - 0.0348)
    assert row["t_commu_predicted"] == pytest.approx(t_commu)
    assert row["t_iter_predicted"] == pytest.approx(t_iter)
    assert row["ratio"] == pytest.approx(t_iter / 0.080)
    assert (row["bandwidth"], row["nodes"], row["reducer"]) == ("100mbit", 4, "dense")
    # rest: measured 80 - 34.8 - 30 = 15.2 ms; predicted t_data + P = 1's rest + the check = 1 + 14.2 + 6.024 ms
    assert (row["rest_measured"], row["rest_predicted"]) == (pytest.approx(0.0152), pytest.approx(0.021224))
    md = (root / "analysis" / "validation.md").read_text()
    ratio = f"{t_iter / 0.080:.2f}"
    assert (
        f"| 100mbit | resnet20 | 4 | dense | 80.0 | {1e3 * t_iter:.1f} | {ratio} | 34.8 / 34.8 | 30.0 / 12.0 | "
        "15.2 / 21.2 |" in md
    )
    # one job: median = range; the ratio (0.85) is inside 0.75-1.33, so no row is named
    assert f"| 100mbit | 4 | 1 | {ratio} | {ratio} - {ratio} | none | 1.00 |" in md


def test_summary_names_the_rows_outside_the_band():
    """The per-(bandwidth, P) line counts the rows, gives the median and range of the
    ratios, and names each row outside 0.75-1.33 with its model, reducer and ratio."""
    rows = [
        {"bandwidth": "1gbit", "model": m, "nodes": 8, "reducer": r, "ratio": x}
        for m, r, x in [("vgg16", "gtopk", 0.70), ("vgg16", "dense", 0.95), ("resnet20", "topk", 1.40)]
    ]
    times = {"t_iter_measured": 0.1, "t_iter_predicted": 0.1, "t_compute_measured": 0.05}
    times |= {"t_compute_predicted": 0.05, "t_commu_measured": 0.01, "t_commu_predicted": 0.01}
    times |= {"rest_measured": 0.04, "rest_predicted": 0.04}
    md = validate.markdown(pd.DataFrame([{**r, **times} for r in rows]))
    assert "| 1gbit | 8 | 3 | 0.95 | 0.70 - 1.40 | vgg16 gtopk 0.70, resnet20 topk 1.40 | 1.00 |" in md


def test_overlapping_reducer_is_compared_on_its_whole_all_reduce():
    """DDP: the model's t_commu is the whole all-reduce, hidden in backward or not, so the
    measured side is t_commu_backward; the rest subtracts the part the step waited for (the
    summary's t_commu, the model's t_exposed), whatever the reducer."""
    measured = {"t_iter": 0.050, "t_compute": 0.040, "t_commu": 0.004, "t_commu_backward": 0.030}
    predicted = {"t_iter": 0.045, "t_compute": 0.035, "t_commu": 0.020, "t_exposed": 0.002}
    row = validate.ratio_row(measured, predicted, overlaps_backward=True)
    assert row["ratio"] == pytest.approx(0.9)  # 0.045 / 0.050
    assert row["t_commu_measured"] == 0.030 and row["commu_ratio"] == pytest.approx(2 / 3)
    assert row["rest_measured"] == pytest.approx(0.006)  # 0.050 - 0.040 - 0.004
    assert row["rest_predicted"] == pytest.approx(0.008)  # 0.045 - 0.035 - 0.002
    sequential = validate.ratio_row(measured, predicted, overlaps_backward=False)
    assert sequential["t_commu_measured"] == 0.004 and sequential["commu_ratio"] == pytest.approx(5.0)
    assert sequential["rest_measured"] == pytest.approx(0.006)  # 0.050 - 0.040 - 0.004


def test_bandwidths_sort_by_rate():
    df = pd.DataFrame({"bandwidth": ["1gbit", "100mbit", "10gbit"], "x": [1, 2, 3]})
    assert list(df.sort_values("bandwidth", key=validate.order)["bandwidth"]) == ["100mbit", "1gbit", "10gbit"]


def test_no_matching_job_is_a_one_line_error(tmp_path):
    profile = tmp_path / "profile.json"
    NetworkProfile(alpha=1e-3, beta=1e-6, cluster={"bandwidth": "1gbit"}).save(profile)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no finished benchmark job at P > 1"):
        validate.main([str(tmp_path / "empty"), "--network", str(profile)])
