"""Analyses given what they cannot use say so in one line (SystemExit with a message), never
with a traceback: the payoff without a dense run and without --target-acc, Fig. 5 at scale
on an empty or missing folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ARCHIVE = Path(__file__).resolve().parents[2] / "analysis" / "results" / "fig5_scale" / "runs"
SPARSE = "experiment=fig5_scale,nodes=32,reducer=gtopk,seed=0,threads_per_worker=1"


def one_line_exit(main, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert isinstance(e.value.code, str) and "\n" not in e.value.code
    return e.value.code


def test_payoff_on_sparse_runs_only_names_the_fix(tmp_path):
    from analysis.payoff.cli import main

    shutil.copytree(ARCHIVE / SPARSE, tmp_path / "runs" / SPARSE)
    line = one_line_exit(main, [str(tmp_path / "runs"), "--network", "paper", "--out", str(tmp_path / "out")])
    assert "dense" in line and "--target-acc" in line


def test_scale_on_an_empty_or_missing_folder_is_one_line(tmp_path):
    from analysis.figures.scale import main

    (tmp_path / "empty").mkdir()
    assert "no training run" in one_line_exit(main, [str(tmp_path / "empty")])
    assert "is not a folder" in one_line_exit(main, [str(tmp_path / "missing")])
