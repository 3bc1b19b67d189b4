"""analysis.figures.budgets on two hand-written budgets: the gap to dense at each epoch
against the coverage so far, per budget, with a run still training marked so; a run found
both archived and in progress counts once (the longer)."""

from __future__ import annotations

import shutil

import pytest

from analysis.figures import budgets
from tests.unit.test_analysis import write_training

DONE = {"coverage": 6.5, "top1_still_rising": False, "params": 270}


@pytest.fixture
def folders(tmp_path):
    short, long, live = tmp_path / "short", tmp_path / "long", tmp_path / "live"
    write_training(short, "dense", [0.5, 0.8], nodes=32, summary=DONE, epoch_coverage=[5, 10])
    write_training(short, "gtopk", [0.4, 0.7], nodes=32, summary=DONE, epoch_coverage=[1, 2])
    write_training(long, "dense", [0.5, 0.8, 0.9, 0.92], nodes=32, summary=DONE, epoch_coverage=[5, 10, 15, 20])
    write_training(long, "gtopk", [0.4, 0.75], nodes=32, epoch_coverage=[1, 2])  # no summary: still training
    write_training(live, "gtopk", [0.4, 0.75, 0.88], nodes=32, epoch_coverage=[1, 2, 3])  # the same run, further on
    return short, long, live


def test_budgets_parse_labels_and_folders():
    assert budgets.budgets(["a=x", "y", "b=z"]) == {"a": ["x", "y"], "b": ["z"]}
    with pytest.raises(SystemExit, match="label"):
        budgets.budgets(["x"])


def test_the_gap_per_epoch_per_budget_and_the_longer_copy_of_a_run(folders):
    short, long, live = folders
    pts = budgets.points({"grid": [str(short)], "paper": [str(long), str(live)]}, reducers=["gtopk"])
    grid = pts[pts["budget"] == "grid"].sort_values("epoch")
    assert list(grid["gap"].round(6)) == [0.1, 0.1] and list(grid["coverage"]) == [1, 2]
    assert set(grid["state"]) == {"finished"}
    paper = pts[pts["budget"] == "paper"].sort_values("epoch")
    assert list(paper["gap"].round(6)) == [0.1, 0.05, 0.02]  # the live copy (3 epochs), not the 2-epoch one
    assert set(paper["state"]) == {"training"} and set(paper["epochs"]) == {3}


def test_main_writes_the_figure_and_csv(folders, tmp_path):
    short, long, live = folders
    budgets.main([f"grid={short}", f"paper={long}", str(live), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "fig5_budgets.png").exists() and (tmp_path / "out" / "fig5_budgets.csv").exists()
    shutil.rmtree(tmp_path / "out")
