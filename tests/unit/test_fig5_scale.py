"""analysis.figures.scale (Fig. 5 at scale) on a hand-written partial grid: P = 4 and 16,
dense, Top-k and gTop-k, seeds 0 and 1; some cells finished, one still running, the rest
missing. Five iterations per epoch (tests.unit.test_analysis.write_training); every expected
number is worked out by hand from the curves below."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.figures import scale
from tests.unit.test_analysis import write_training

FINISHED = {"coverage": 6.5, "top1_still_rising": False, "params": 270}
# (reducer, P, seed) -> test top-1 per epoch; P = 4: dense's finals 0.90 and 0.92, median 0.91,
# target 0.99 x 0.91 = 0.9009; P = 16: dense 0.80, target 0.792
GRID = {
    ("dense", 4, 0): [0.5, 0.8, 0.90],
    ("dense", 4, 1): [0.5, 0.8, 0.92],
    ("topk", 4, 0): [0.4, 0.85, 0.905],  # 0.905 >= 0.9009 in epoch 2: 15 iterations; gap 0.90 - 0.905
    ("topk", 4, 1): [0.4, 0.902, 0.88],  # epoch 1: 10 iterations; gap 0.92 - 0.88
    ("gtopk", 4, 0): [0.3, 0.6, 0.85],  # never; gap 0.05 (seed 1 missing)
    ("dense", 16, 0): [0.5, 0.7, 0.80],
    ("gtopk", 16, 0): [0.5, 0.75, 0.795],  # epoch 2: 15 iterations; gap 0.005
}


@pytest.fixture
def grid(tmp_path):
    root = tmp_path / "fig5_scale"
    for (reducer, P, seed), top1 in GRID.items():
        write_training(root, reducer, top1, nodes=P, seed=seed, summary=FINISHED)
    write_training(root, "topk", [0.5, 0.6], nodes=16, seed=0)  # no summary yet: running
    return root


GRID_ARGS = {"nodes": [4, 16], "reducers": ["dense", "topk", "gtopk"], "seeds": [0, 1]}


def row(tab: pd.DataFrame, curve: str, P: int) -> pd.Series:
    sel = tab[(tab["curve"] == curve) & (tab["nodes"] == P)]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_table_across_p_with_seeds_and_the_gap_on_a_partial_grid(grid):
    out = scale.tables([grid], **GRID_ARGS)
    tab = out["table"]
    assert list(zip(tab["nodes"], tab["curve"])) == [
        (4, "dense"), (4, "topk"), (4, "gtopk"), (16, "dense"), (16, "gtopk"),
    ]  # fmt: skip  # P, then plot order; the running Top-k at P = 16 is left out
    topk = row(tab, "topk", 4)
    assert (topk["runs"], topk["seeds"], topk["iterations_to_target_per_seed"]) == (2, "0 / 1", "15 / 10")
    assert (topk["final_top1"], topk["final_top1_min"], topk["final_top1_max"]) == pytest.approx((0.8925, 0.88, 0.905))
    assert topk["target_top1"] == pytest.approx(0.9009)
    assert (topk["gap_mean"], topk["gap_min"], topk["gap_max"]) == pytest.approx((0.0175, -0.005, 0.04))
    assert (topk["coverage"], topk["trend"], topk["reducer_display"]) == (6.5, "flat", "Top-k")
    gtopk = row(tab, "gtopk", 4)
    assert (gtopk["iterations_to_target_per_seed"], gtopk["gap_mean"]) == ("not reached", pytest.approx(0.05))
    assert row(tab, "gtopk", 16)["iterations_to_target_per_seed"] == "15"
    assert pd.isna(row(tab, "dense", 16)["gap_mean"])
    gap = out["gap"].set_index(["nodes", "curve"])
    assert (gap.loc[(4, "topk"), "seeds"], gap.loc[(16, "gtopk"), "gap_mean"]) == (2, pytest.approx(0.005))
    # the grid is partial: which cells are missing or running, said under the table and in the provenance
    cells = out["grid"]
    assert len(cells) == 12 and cells["state"].value_counts().to_dict() == {"finished": 7, "missing": 4, "running": 1}
    md = scale.markdown(tab, cells)
    assert "| 4 | Top-k | 2 (0 / 1) | 89.2 (88.0-90.5) | 1.8 (-0.5 to 4.0) | 15 / 10 | 6.5 | flat |" in md
    assert "7 of 12 cells (P x reducer x seed) finished:" in md
    assert "* missing: P = 4 gTop-k: seed 1; P = 16 dense: seed 1; P = 16 Top-k: seed 1; P = 16 gTop-k: seed 1" in md
    assert "* running: P = 16 Top-k: seed 0" in md
    prov = scale.provenance(cells)
    assert "cells: 7 of 12 finished (7 finished, 4 missing, 1 running)" in prov and "at commit " in prov


@pytest.mark.slow
def test_the_outputs_and_their_published_copies(grid, tmp_path):
    args = [str(grid), "--nodes", "4", "16", "--reducers", "dense", "topk", "gtopk", "--seeds", "0", "1"]
    scale.main([*args, "--publish", str(tmp_path / "results")])
    for name in ("fig5_scale.png", "fig5_scale_gap_coverage.png", "fig5_scale.csv", "fig5_scale_cells.csv"):
        assert (grid / "analysis" / name).stat().st_size > 0
    tab = pd.read_csv(grid / "analysis" / "fig5_scale_table.csv")
    assert row(tab, "topk", 4)["iterations_to_target_per_seed"] == "15 / 10"
    published = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert published == [
        "fig5_scale.csv", "fig5_scale.png", "fig5_scale_cells.csv", "fig5_scale_gap_coverage.csv",
        "fig5_scale_gap_coverage.png", "fig5_scale_table.csv", "fig5_scale_table.md", "provenance.md",
    ]  # fmt: skip  # no PDF


def test_without_a_grid_the_cells_found_are_the_grid(grid):
    cells = scale.cells([grid])
    assert (sorted(cells["nodes"].unique()), sorted(cells["seed"].unique())) == ([4, 16], [0, 1])
    assert list(cells["reducer"].unique()) == ["dense", "topk", "gtopk"]  # plot order


def test_no_finished_run_is_a_one_line_error(tmp_path):
    write_training(tmp_path / "r", "dense", [0.5, 0.6])  # running
    with pytest.raises(SystemExit, match="no finished training run under .*make reproduce-scale"):
        scale.tables([tmp_path / "r"])


def test_reproduce_scale_analyses_the_experiments_whole_grid(monkeypatch):
    from analysis import reproduce
    from analysis.reproduce import steps

    calls = []
    monkeypatch.setattr(steps, "run", calls.append)
    reproduce.main(["scale", "seed=1"])  # an override narrows the grid the cells are counted in
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "analysis.figures.scale", "runs/fig5_scale"]
    seeds = cmd.index("--seeds")
    assert cmd[4:8] == ["--nodes", "4", "16", "32"] and cmd[8] == "--reducers"
    assert {"dense", "topk", "gtopk", "gtopk_exact"} <= set(cmd[9:seeds])  # conf/experiment/fig5_scale.yaml's axis
    assert cmd[seeds:] == ["--seeds", "1", "--publish", str(reproduce.SCALE_RESULTS)]


def test_a_variant_of_a_reducer_is_a_cell_of_its_own(grid, tmp_path):
    """Runs of one reducer at the same P and seed with another setting (the sampled threshold)
    or another density are cells and table rows of their own, not duplicates that hide each
    other (one of two finished runs under one key used to drop out of the table)."""
    import yaml

    other = tmp_path / "variants"
    sampled = write_training(other, "gtopk", [0.3, 0.6, 0.86], nodes=4, seed=0, summary=FINISHED)
    cfg = yaml.safe_load((sampled / "config.yaml").read_text())
    cfg["reducer"]["selection"] = "sampled"
    (sampled / "config.yaml").write_text(yaml.safe_dump(cfg))
    write_training(other, "gtopk", [0.3, 0.7, 0.87], nodes=4, seed=0, density=0.02, summary=FINISHED)
    out = scale.tables([grid, other], **GRID_ARGS)
    cells = out["grid"].set_index(["nodes", "reducer", "seed"])["state"]
    assert cells[(4, "gtopk", 0)] == cells[(4, "gtopk selection=sampled", 0)] == "finished"
    assert cells[(4, "gtopk rho=0.02", 0)] == "finished"
    finals = {r["curve"]: r["final_top1"] for _, r in out["table"][out["table"]["nodes"] == 4].iterrows()}
    assert finals["gtopk"] == pytest.approx(0.85) and finals["gtopk selection=sampled"] == pytest.approx(0.86)
    assert finals["gtopk rho=0.02"] == pytest.approx(0.87)


def test_reproduce_paper_length_ends_with_the_payoff_and_the_readme(monkeypatch):
    """``make reproduce-paper-length``'s analysis: the table, the budgets figure, the payoff
    priced on the committed 1 Gbit/s calibration and published beside them, then the README's
    answer table (issue 44 point 5)."""
    from analysis import reproduce
    from analysis.reproduce import at_scale, publish, steps

    calls, published = [], []
    monkeypatch.setattr(steps, "run", calls.append)
    monkeypatch.setattr(publish, "publish", lambda dest, outputs, cmd, **kw: published.append((dest, outputs, cmd)))
    reproduce.main(["paper_length", "nodes=32"])
    assert [c[2] for c in calls] == [
        "analysis.figures.scale",
        "analysis.figures.budgets",
        "analysis.payoff",
        "analysis.readme",
    ]
    payoff = calls[2]
    assert payoff[3] == "runs/fig5_paper_length"
    assert payoff[payoff.index("--network") + 1] == str(at_scale.PAYOFF_NETWORK) and at_scale.PAYOFF_NETWORK.exists()
    assert payoff[payoff.index("--bench") + 1] == "none"  # not whatever benchmark jobs this clone's runs/ holds
    ((dest, outputs, cmd),) = published
    assert dest == at_scale.PAPER_LENGTH_RESULTS
    assert {"payoff_verdicts.txt", "payoff_versus.md", "payoff_versus.csv"} <= set(outputs)
    assert cmd == "python -m analysis.reproduce paper_length nodes=32"
