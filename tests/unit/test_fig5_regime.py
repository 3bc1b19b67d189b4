"""The Fig. 5 table's regime columns (coverage, trend, seeds) and the gap-against-coverage
CSV, on hand-written run directories whose answers are worked out by hand below: 5
iterations per epoch, 270 parameters, sparse updates of 27 coordinates per iteration."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.figures import fig5
from gtopk.records.rundir import RunDir
from tests.unit.test_analysis import csv, write_training

M = 270  # parameters: write_training's dense update_nnz


@pytest.fixture
def fig5_runs(tmp_path):
    root = tmp_path / "fig5_seeds"
    # dense, two seeds: finals 0.90 and 0.92, target 0.99 x median 0.91 = 0.9009; coverage 15 x 270 / 270
    write_training(root, "dense", [0.5, 0.8, 0.90], seed=0, summary={"params": M})
    write_training(root, "dense", [0.5, 0.85, 0.92], seed=1, summary={"params": M})
    # gTop-k seed 0: coverage and a rising trend from its summary; never reaches 0.9009
    write_training(root, "gtopk", [0.3, 0.6, 0.85], seed=0, summary={"coverage": 0.7, "top1_still_rising": True})
    # gTop-k seed 1: no summary: coverage from the last epoch row (0.5), trend fitted (flat:
    # slope 0.31 per epoch, its 95 % interval with 1 degree of freedom spans 0); 0.91 at epoch 1
    write_training(root, "gtopk", [0.3, 0.91, 0.92], seed=1, epoch_coverage=[0.1, 0.3, 0.5])
    # Top-k: coverage computed from update_nnz: 15 iterations x 27 / 270 = 1.5; 0.905 at epoch 1
    write_training(root, "topk", [0.4, 0.905, 0.88], seed=0, summary={"params": M})
    # gTop-k rho 0.01, seed 2: no dense run of seed 2 -> dense's mean over seeds
    write_training(root, "gtopk", [0.4, 0.7, 0.81], density=0.01, seed=2, summary={"coverage": 3.0})
    # recorded before coverage: no summary, no epoch coverage -> blank
    write_training(root, "gtopk", [0.2, 0.4, 0.6], nodes=8)
    fig5.main([str(root)])
    return root


def test_table_coverage_trend_and_seeds(fig5_runs):
    tab = csv(fig5_runs, "fig5_table").set_index("label")
    g = tab.loc["gtopk rho=0.001 P=4"]
    assert (g["runs"], g["seeds"]) == (2, "0 / 1")
    assert (g["final_top1"], g["final_top1_min"], g["final_top1_max"]) == pytest.approx((0.885, 0.85, 0.92))
    assert g["iterations_to_target_per_seed"] == "not reached / 10"
    assert g["iterations_to_target"] == "not reached"  # the median of (never, 10)
    assert g["coverage"] == pytest.approx(0.6)  # mean of 0.7 (summary) and 0.5 (last epoch row)
    assert g["trend"] == "still rising in 1/2 seeds"
    t = tab.loc["topk rho=0.001 P=4"]
    assert t["coverage"] == pytest.approx(1.5)
    assert (t["iterations_to_target_per_seed"], t["iterations_to_target"]) == ("10", "10")
    assert t["trend"] == "flat"
    d = tab.loc["dense P=4"]
    # seed 0's final 0.90 is below 99 % of the median of 0.90 and 0.92
    assert (d["coverage"], d["seeds"], d["iterations_to_target_per_seed"]) == (15.0, "0 / 1", "not reached / 15")
    assert tab.loc["dense P=4", "target_top1"] == pytest.approx(0.9009)
    assert pd.isna(tab.loc["gtopk rho=0.001 P=8", "coverage"])
    assert tab.loc["gtopk rho=0.001 P=8", "trend"] == "still rising"  # 0.2, 0.4, 0.6: no noise
    md = (fig5_runs / "analysis" / "fig5_table.md").read_text()
    assert (
        "| resnet20 | 4 | gtopk rho=0.001 P=4 | 0 / 1 | 0.885 (0.850-0.920) | 0.920 | not reached / 10 | "
        "not reached | not reached | 0.6 | still rising in 1/2 seeds |"
    ) in md
    assert "| resnet20 | 8 | gtopk rho=0.001 P=8 | 0 | 0.600 | 0.600 |  |  |  |  | still rising |" in md


def test_gap_against_coverage(fig5_runs):
    for ext in ("png", "pdf", "csv"):
        assert (fig5_runs / "analysis" / f"gap_coverage.{ext}").stat().st_size > 0
    pts = csv(fig5_runs, "gap_coverage")
    end = pts[pts["final"]].set_index(["label", "seed"])
    assert set(end.index) == {
        ("gtopk rho=0.001 P=4", 0),
        ("gtopk rho=0.001 P=4", 1),
        ("topk rho=0.001 P=4", 0),
        ("gtopk rho=0.01 P=4", 2),
    }  # dense is the reference; P = 8 has no dense run and no coverage
    assert end.loc[("gtopk rho=0.001 P=4", 0), ["coverage", "gap"]].tolist() == pytest.approx([0.7, 0.05])
    assert end.loc[("gtopk rho=0.001 P=4", 0), "dense_from"] == "seed 0"
    assert end.loc[("gtopk rho=0.001 P=4", 1), ["coverage", "gap"]].tolist() == pytest.approx([0.5, 0.0])
    assert end.loc[("topk rho=0.001 P=4", 0), ["coverage", "gap"]].tolist() == pytest.approx([1.5, 0.02])
    other = end.loc[("gtopk rho=0.01 P=4", 2)]
    assert (other["dense_from"], other["dense_top1"], other["gap"]) == (
        "mean of 2 dense runs",
        0.91,
        pytest.approx(0.1),
    )
    assert set(pts["curve"]) == {"gtopk", "topk"}
    # seed 1's epochs (coverage so far 0.1, 0.3, 0.5) against dense seed 1 at the same epoch
    seed1 = pts[~pts["final"] & (pts["seed"] == 1)].sort_values("epoch")
    assert seed1["coverage"].tolist() == [0.1, 0.3, 0.5]
    assert seed1["gap"].tolist() == pytest.approx([0.2, -0.06, 0.0])


def test_reproduce_fig5_sweeps_per_dataset():
    """make reproduce-fig5 [DATA=fashion] [FULL=1]: which run.py -m sweeps, into which folder."""
    from analysis.reproduce import fig5_sweeps, first_job

    assert fig5_sweeps([], False, "digits") == [["experiment=fig5_quick"]]  # the default stays the digits
    sparse, dense, second, baselines = fig5_sweeps(["train.epochs=3"], False, "fashion")
    assert sparse == ["experiment=fig5_fashion_quick", "train.epochs=3"]
    assert dense == ["experiment=fig5_fashion_quick", "reducer=dense", "density=0.001", "train.epochs=3"]
    # a second seed of every reducer at the paper's point, and the hook baselines on real processes
    assert second == [
        "experiment=fig5_fashion_quick",
        "density=0.001",
        "seed=1,2",
        "reducer=dense,topk,gtopk,gtopk_exact",
        "train.epochs=3",
    ]
    assert baselines == ["experiment=fig5_fashion_baselines", "reducer=ddp_fp16,powersgd", "train.epochs=3"]
    folders = {first_job(s)[0] for s in (sparse, dense, second, baselines)}
    assert folders == {Path("runs/fig5_fashion_quick")}  # one table, one payoff folder
    # a seed override replaces the second pass's seed
    second = fig5_sweeps(["seed=2,3"], False, "fashion")[2]
    assert "seed=1,2" not in second and second[-1] == "seed=2,3"
    # an override that sets the reducer replaces both passes' reducer axis: one sweep
    assert fig5_sweeps(["reducer=dense,gtopk"], False, "fashion") == [
        ["experiment=fig5_fashion_quick", "reducer=dense,gtopk"]
    ]
    assert fig5_sweeps([], True, "fashion") == [["experiment=fig5_fashion_paper"]]


def test_fig5_curves_draw_each_reducer_once_with_its_seeds_spread():
    """Fig. 5's curves: the seeds of one curve become their mean with a min-max band; an
    epoch only one seed recorded yet (a run still training) is that seed's value."""
    from analysis.figures.fig5 import seed_band

    rows = [
        {"run_dir": "s0", "epoch": e, "iterations": 40 * (e + 1), "test_top1": v} for e, v in enumerate([0.5, 0.7, 0.8])
    ] + [{"run_dir": "s1", "epoch": e, "iterations": 40 * (e + 1), "test_top1": v} for e, v in enumerate([0.3, 0.9])]
    mean, low, high, seeds = seed_band(pd.DataFrame(rows), "iterations", "test_top1")
    assert seeds == 2
    assert mean.index.tolist() == [40, 80, 120]
    assert mean.tolist() == pytest.approx([0.4, 0.8, 0.8])
    assert low.tolist() == pytest.approx([0.3, 0.7, 0.8]) and high.tolist() == pytest.approx([0.5, 0.9, 0.8])
    mean, *_ = seed_band(pd.DataFrame(rows), "epoch", "test_top1")
    assert mean.index.tolist() == [0, 1, 2]


@pytest.mark.parametrize("experiment, jobs", [("fig5_fashion_baselines", 6), ("fig5_baselines", 2)])
def test_the_hook_baselines_sweep_no_density_axis(compose, experiment, jobs):
    """The hooks do not sparsify: their Fig. 5 sweep must not inherit the quick variant's
    density axis (each density would train the same job again, under another name, and the
    table would count the copies as seeds)."""
    sweep = compose([f"experiment={experiment}"], hydra=True).hydra.sweeper.params
    axes = {key: str(values).split(",") for key, values in sweep.items()}
    assert len(axes.get("density", ["one"])) == 1 and axes["nodes"] == ["4"]
    assert sorted(axes["reducer"]) == ["ddp_fp16", "powersgd"]
    count = 1
    for values in axes.values():
        count *= len(values)
    assert count == jobs
    cfg = compose([f"experiment={experiment}", "reducer=powersgd"])
    assert cfg.cluster_name == "local"  # real worker processes: the hooks run inside DDP


def _run_with_steps(path: Path, backend: str, steps: list[dict]) -> RunDir:
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"backend": backend}))
    rows = [{"iter": i, "warmup": False, "density": 0.001, **s} for i, s in enumerate(steps)]
    (path / "iters.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return RunDir(path)


def test_a_simulated_runs_overheads_are_its_shared_step_not_the_other_ranks_gradients(tmp_path):
    """make payoff without benchmark jobs models t_iter from the training runs' own steps. A
    simulated step's t_iter holds all P ranks' gradients (here 4 x 0.05 s): one rank's rest
    of the step is the recorded t_update (aggregation and SGD step), not t_iter less one
    rank's parts (0.16 s more); a real rank's rest is what its t_iter leaves."""
    from analysis.training import SIMULATED_BACKEND, own_overheads
    from gtopk.simulated.ranks import BACKEND

    assert SIMULATED_BACKEND == BACKEND
    step = {"t_data": 0.001, "t_compute": 0.05, "t_compr": 0.002, "t_commu": 0.0}
    simulated = _run_with_steps(tmp_path / "sim", BACKEND, [{**step, "t_update": 0.004, "t_iter": 0.207}] * 3)
    assert own_overheads(simulated) == pytest.approx({"t_data": 0.001, "t_compr": 0.002, "t_update": 0.004})
    real = _run_with_steps(tmp_path / "real", "gloo", [{**step, "t_commu": 0.01, "t_update": 0.9, "t_iter": 0.07}] * 3)
    assert own_overheads(real)["t_update"] == pytest.approx(0.07 - 0.001 - 0.05 - 0.002 - 0.01)


def test_overheads_are_rank_0s_so_a_run_and_its_archive_agree(tmp_path):
    """The archive keeps rank 0's rows alone: overheads from every rank's rows would change
    when a published payoff is made again from the restored archive."""
    from analysis.training import own_overheads
    from gtopk.records import archive
    from gtopk.simulated.ranks import BACKEND

    step = {"t_data": 0.001, "t_compute": 0.05, "t_commu": 0.0, "t_iter": 0.2}
    run = _run_with_steps(tmp_path / "runs" / "job", BACKEND, [{**step, "t_compr": 0.002, "t_update": 0.004}] * 3)
    other = [
        {"iter": i, "warmup": False, "density": 0.001, **step, "t_compr": 0.009, "t_update": 0.008} for i in range(3)
    ]
    (run.path / "iters.rank1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other * 2))
    (run.path / "summary.json").write_text(json.dumps({"backend": BACKEND, "iterations": 3}))
    (run.path / "config.yaml").write_text("name: job\n")
    assert own_overheads(run) == pytest.approx({"t_data": 0.001, "t_compr": 0.002, "t_update": 0.004})
    archive.save(tmp_path / "runs", tmp_path / "archive")
    archive.restore(tmp_path / "archive", tmp_path / "restored")
    restored = RunDir(tmp_path / "restored" / "job")
    assert not restored.iters(1).exists()  # the archive dropped rank 1's rows ...
    assert own_overheads(restored) == own_overheads(run)  # ... and the overheads did not move
