"""The analysis scripts on generated records: outputs exist, and the numbers in their CSVs
equal hand-computed efficiencies, speedups and model predictions."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import yaml

from analysis import scaling
from analysis.figures import breakdown, commmodel, fig5, fig6, table4
from analysis.load import _merge, load_epochs, load_jobs, wandb_rows
from gtopk.perf.netprofile import NetworkProfile
from gtopk.train.replay_backward import ready_times

REDUCERS = {
    "dense": {"_target_": "gtopk.reducers.DenseReducer", "bucket_mb": 25.0},
    "topk": {"_target_": "gtopk.reducers.TopKReducer", "density": 0.001, "reselect": False},
    "gtopk": {"_target_": "gtopk.reducers.GTopKReducer", "density": 0.001, "algorithm": "tree", "putback": "index"},
    "ddp": {"_target_": "baselines.ddp.DDPReducer", "bucket_mb": 25.0},
}
M, BATCH = 1_000_000, 100  # parameters, images per step
ALPHA, BETA = 1e-3, 1e-8  # the test network: 1 ms per message, 100 MB/s
# t_iter (s) per (reducer, P): v = 100 / t_iter images/s per worker
T_ITER = {
    ("dense", 1): 0.105,
    ("dense", 2): 0.125,
    ("dense", 4): 0.200,
    ("topk", 1): 0.100,
    ("topk", 2): 0.115,
    ("topk", 4): 0.125,
    ("gtopk", 1): 0.100,
    ("gtopk", 2): 0.112,
    ("gtopk", 4): 0.116,
    ("ddp", 1): 0.100,
    ("ddp", 2): 0.110,
    ("ddp", 4): 0.160,
}
LOCAL = {"t_data": 0.001, "t_compute": 0.080, "t_update": 0.009}  # + t_compr 0.01 (sparse) or t_commu 0.01
# (dense, DDP: at P = 1 a local copy, which the model counts as local time) = t_iter at P = 1


def write_job(root: Path, reducer: str, P: int, model: str = "resnet20", name: str = "fig6_test") -> Path:
    d = root / f"model={model},nodes={P},reducer={reducer}"
    d.mkdir(parents=True)
    sparse = "density" in REDUCERS[reducer]
    t_compr = 0.010 if sparse else 0.0
    t_iter = T_ITER[(reducer, P)]
    t_commu = t_iter - sum(LOCAL.values()) - t_compr
    cfg = {
        "name": name,
        "reducer": REDUCERS[reducer],
        "reducer_name": reducer,
        "model_name": model,
        "nodes": P,
        "density": 0.001,
        "mode": "benchmark",
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    summary = {
        "reducer": reducer,
        "model": model,
        "nodes": P,
        "density": 0.001,
        "params": M,
        "mode": "benchmark",
        "batch_per_worker": BATCH,
        "grad_accum_steps": 1,
        "cluster": "emulated",
        "compute": "replay",
        "t_compr": t_compr,
        "t_commu": t_commu,
        "t_iter": t_iter,
        **LOCAL,
        "images_per_s_per_worker": BATCH / t_iter,
        "env": {"cpu": "test", "host": "h", "git_commit": "x"},
    }
    (d / "summary.json").write_text(json.dumps(summary))
    return d


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "fig6_test"
    for reducer, P in T_ITER:
        write_job(root, reducer, P)
    net = NetworkProfile(alpha=ALPHA, beta=BETA, name="test")
    net.save(tmp_path / "profile.json")
    return root, tmp_path / "profile.json"


def csv(root: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(root / "analysis" / f"{name}.csv")


def outputs_exist(root: Path, stem: str, figure: bool = True) -> None:
    for ext in ("png", "pdf", "csv") if figure else ("csv",):
        assert (root / "analysis" / f"{stem}.{ext}").stat().st_size > 0


def test_loader_reads_every_job(runs):
    root, _ = runs
    jobs = load_jobs([root])
    assert len(jobs) == len(T_ITER)
    assert set(jobs["reducer"]) == set(REDUCERS) and set(jobs["source"]) == {"local"}
    assert jobs.loc[jobs["reducer"] == "gtopk", "reducer_cfg"].iloc[0]["algorithm"] == "tree"


def test_fig6_measured_and_modelled_efficiency(runs):
    root, profile = runs
    fig6.main([str(root), "--network", str(profile)])
    outputs_exist(root, "fig6")
    df = csv(root, "fig6")
    meas = df[df["kind"] == "measured"].set_index(["reducer", "nodes"])["efficiency"]
    for (reducer, P), t in T_ITER.items():  # v_1: ddp at P = 1 (t_iter 0.1 s) for every line
        assert meas[(reducer, P)] == pytest.approx(0.100 / t)
    mod = df[df["kind"] == "modelled"].set_index(["reducer", "nodes"])
    assert sorted(mod.loc["gtopk"].index) == [1, 2, 4, 16, 32]
    # gTop-k tree, index put-back at P = 32: 2 log2 P (alpha + 8 k beta), k = 1000
    t_commu = 2 * 5 * (ALPHA + 8 * 1000 * BETA)
    check = 2 * 31 * (ALPHA + 4 * BETA)  # the loop's non-finite check: a ring all-reduce of 32 flags
    t_iter = sum(LOCAL.values()) + 0.010 + t_commu + check  # local times from its P = 1 job
    assert mod.loc[("gtopk", 32), "t_commu"] == pytest.approx(t_commu)
    assert mod.loc[("gtopk", 32), "efficiency"] == pytest.approx(0.100 / t_iter)
    # DDP overlaps what backward allows: ResNet-20's 269,722 parameters are one 25 MB bucket,
    # ready when backward ends (it holds the first layer), so nothing is hidden: t_compute + ring + check
    ring = 2 * 31 * (ALPHA + math.ceil(269_722 / 32) * 4 * BETA)
    assert mod.loc[("ddp", 32), "efficiency"] == pytest.approx(0.100 / (0.100 + ring + check))
    paper = df[df["kind"] == "paper"].set_index(["model", "reducer", "nodes"])["efficiency"]
    assert paper[("resnet20", "gtopk", 32)] == pytest.approx(789.3 / 920.632)


def test_v1_falls_back_to_dense_without_a_ddp_job(runs):
    root, _ = runs
    jobs = load_jobs([root])
    eff = scaling.measured(jobs[jobs["reducer"] != "ddp"]).set_index(["reducer", "nodes"])
    assert set(eff["v1_from"]) == {"dense"}
    assert eff.loc[("gtopk", 4), "efficiency"] == pytest.approx(0.105 / 0.116)
    with pytest.raises(ValueError, match="no P = 1 job"):
        scaling.measured(jobs[jobs["nodes"] > 1])


def test_table4_speedups(runs):
    root, profile = runs
    table4.main([str(root), "--network", str(profile)])
    outputs_exist(root, "table4", figure=False)
    assert (root / "analysis" / "table4.md").read_text().startswith("| model |")
    t = csv(root, "table4").set_index(["cluster", "nodes", "kind"])
    row = t.loc[("emulated", 4, "measured")]
    assert row["e_gtopk"] == pytest.approx(0.100 / 0.116)
    assert row["gtopk/dense"] == pytest.approx(0.200 / 0.116)
    assert row["gtopk/topk"] == pytest.approx(0.125 / 0.116)
    assert row["gtopk/ddp"] == pytest.approx(0.160 / 0.116)
    assert row["dense/ddp"] == pytest.approx(0.160 / 0.200)  # the dense reducer against DDP
    assert row["topk/ddp"] == pytest.approx(0.160 / 0.125)
    paper = t.loc[("paper", 32, "paper")]
    assert paper["gtopk/dense"] == pytest.approx(789.3 / 287.9)
    assert math.isnan(paper["gtopk/ddp"])  # the paper had no DDP line


def test_breakdown_bars(runs):
    root, profile = runs
    breakdown.main([str(root), "--network", str(profile)])
    outputs_exist(root, "breakdown")
    b = csv(root, "breakdown").set_index(["kind", "reducer"])
    g = b.loc[("measured", "gtopk")]
    assert g["nodes"] == 4 and g["t_compute"] == pytest.approx(0.080)
    assert g["t_compute"] + g["t_compr"] + g["t_commu"] + g["t_other"] == pytest.approx(0.116)
    assert b.loc[("modelled", "gtopk"), "nodes"] == 32
    assert b.loc[("paper", "gtopk"), "t_commu"] == pytest.approx(0.024686)


def test_comm_model_check(runs):
    root, profile = runs
    commmodel.main([str(root), "--network", str(profile)])
    outputs_exist(root, "commmodel")
    c = csv(root, "commmodel").set_index(["reducer", "nodes"])
    assert 1 not in c.index.get_level_values("nodes")
    assert c.loc[("gtopk", 4), "t_commu_predicted"] == pytest.approx(2 * 2 * (ALPHA + 8000 * BETA))
    assert c.loc[("gtopk", 4), "t_commu_measured"] == pytest.approx(0.116 - 0.09 - 0.01)


def write_training(
    root: Path,
    reducer: str,
    top1: list[float],
    nodes: int = 4,
    density: float = 0.001,
    seed: int = 0,
    summary: dict | None = None,
    epoch_coverage: list[float] | None = None,
) -> Path:
    """A finished-looking training run: 2 ranks' rows, 5 iterations per epoch (rank r's
    residual norm = iteration + 1 + r, lost_l1 0.5 per rank for the sparse reducers;
    update_nnz 27 of the 270 parameters for the sparse reducers, 270 for dense), with a
    ``summary.json`` when given and ``coverage`` in the epoch rows when given."""
    d = root / (f"reducer={reducer},nodes={nodes},density={density}" + (f",seed={seed}" if seed else ""))
    d.mkdir(parents=True)
    cfg = {
        "name": root.name,
        "reducer": {**REDUCERS[reducer], **({"density": density} if "density" in REDUCERS[reducer] else {})},
        "reducer_name": reducer,
        "model_name": "resnet20",
        "nodes": nodes,
        "density": density,
        "data_name": "digits",
        "data": {"image_size": 8},
        "batch_size": 32,
        "grad_accum": 1,
        "mode": "train",
        "seed": seed,
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    rows = [{"epoch": e, "train_loss": 1 - a, "test_loss": 1.1 - a, "test_top1": a} for e, a in enumerate(top1)]
    for row, cov in zip(rows, epoch_coverage or []):
        row["coverage"] = cov
    (d / "epochs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sparse = reducer != "dense"
    for rank in (0, 1):
        its = [
            {
                "rank": rank,
                "iter": it,
                "epoch": it // 5,
                "update_nnz": 27 if sparse else 270,
                "residual_norm": float(it + 1 + rank) if sparse else 0.0,
                "lost_l1": 0.5 if reducer == "gtopk" else 0.0,
            }
            for it in range(5 * len(top1))
        ]
        (d / f"iters.rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in its))
    return d


def test_fig5_table_counts_iterations_to_99_percent_of_dense_at_the_same_p(tmp_path):
    root = tmp_path / "fig5_test"
    write_training(root, "dense", [0.5, 0.8, 0.9])  # final 0.9: the target is 0.891
    write_training(root, "topk", [0.4, 0.895, 0.88])  # 0.895 >= 0.891 at the end of epoch 1: 10 iterations
    write_training(root, "gtopk", [0.3, 0.6, 0.85])  # never
    write_training(root, "gtopk", [0.2, 0.95], nodes=8)  # no dense run at P = 8: no target
    fig5.main([str(root)])
    for name in ("fig5.png", "fig5.csv", "fig5_table.csv", "fig5_table.md", "fig5_gap.png", "fig5_gap.csv"):
        assert (root / "analysis" / name).stat().st_size > 0
    tab = csv(root, "fig5_table").set_index("label")
    assert tab.loc["topk rho=0.001 P=4", "iterations_to_target"] == "10"
    assert tab.loc["topk rho=0.001 P=4", "epochs_to_target"] == "2"
    assert tab.loc["topk rho=0.001 P=4", "target_top1"] == pytest.approx(0.891)
    assert tab.loc["dense P=4", "iterations_to_target"] == "15"  # its own final epoch
    assert tab.loc["gtopk rho=0.001 P=4", "iterations_to_target"] == "not reached"
    assert tab.loc["gtopk rho=0.001 P=4", "final_top1"] == pytest.approx(0.85)
    assert pd.isna(tab.loc["gtopk rho=0.001 P=8", "iterations_to_target"])
    assert tab.loc["gtopk rho=0.001 P=8", "iterations"] == 10
    md = (root / "analysis" / "fig5_table.md").read_text()
    assert "| resnet20 | 4 | gtopk rho=0.001 P=4 | 0 | 0.850 | 0.850 | not reached | not reached | not reached |" in md
    curves = csv(root, "fig5")
    assert curves[curves["label"] == "topk rho=0.001 P=4"]["iterations"].tolist() == [5, 10, 15]
    gap = csv(root, "fig5_gap").set_index(["label", "iteration"])
    row = gap.loc[("gtopk rho=0.001 P=4", 3)]
    assert (row["update_nnz"], row["residual_norm"], row["residual_norm_min"], row["residual_norm_max"]) == (
        27,
        4.5,
        4,
        5,
    )
    assert row["lost_l1"] == pytest.approx(1.0)  # summed over the two ranks
    assert gap.loc[("topk rho=0.001 P=4", 3), "lost_l1"] == 0.0


def test_fig5_density_takes_the_dense_baseline_from_another_folder(tmp_path):
    full, density = tmp_path / "full", tmp_path / "density"
    write_training(full, "dense", [0.5, 0.9])
    write_training(full, "topk", [0.5, 0.9])  # not dense: stays out
    write_training(density, "gtopk", [0.3, 0.892], density=0.0005)
    fig5.main([str(density), "--dense-from", str(full), "--stem", "density"])
    tab = csv(density, "density_table").set_index("label")
    assert set(tab.index) == {"dense P=4", "gtopk rho=0.0005 P=4"}
    assert str(tab.loc["gtopk rho=0.0005 P=4", "iterations_to_target"]) == "10"


def test_wandb_runs_join_without_duplicates(runs):
    root, _ = runs
    local = load_jobs([root]).assign(wandb_id=None)
    local.loc[0, "wandb_id"] = "abc"
    summary = json.loads(next(root.rglob("summary.json")).read_text())

    def run(rid: str, mode: str):
        cfg = {
            "name": "x",
            "reducer": REDUCERS["gtopk"],
            "reducer_name": "gtopk",
            "model_name": "vgg16",
            "nodes": 4,
            "density": 0.001,
            "mode": mode,
        }
        return SimpleNamespace(
            id=rid,
            path=["ent", "proj", rid],
            config=cfg,
            summary=summary,
            history=lambda keys, pandas: [{"epoch": 0, "train_loss": 2.0, "test_top1": 0.1}],
        )

    jobs, epochs = wandb_rows([run("abc", "benchmark"), run("new", "train")])
    assert len(jobs) == 2 and len(epochs) == 1 and epochs[0]["source"] == "wandb"
    merged = _merge(local, pd.DataFrame(jobs))
    assert len(merged) == len(local) + 1  # "abc" is a local run already
    assert load_epochs([root]).empty  # benchmark runs record no epochs


def test_replayed_backward_spreads_compute_over_layers():
    params = [torch.nn.Parameter(torch.zeros(s)) for s in ((4, 3), (4,), (2, 4), (2,))]
    t = ready_times(params, start=10.0, t_compute=3.0, forward_share=1 / 3)
    # forward 1 s, then two layers of 1 s each, the last layer first; biases with their layer
    assert t == pytest.approx([13.0, 13.0, 12.0, 12.0])
