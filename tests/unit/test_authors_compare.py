"""``tests.bench.authors_compare`` without MPI: the inputs both sides build, how results are
compared, and the table from hand-made run JSONs.

SKIPPED unless set up by hand: ``test_both_sides_end_to_end`` needs a checkout of the authors'
code (``GTOPK_AUTHORS_CHECKOUT``), a Python with mpi4py (``GTOPK_MPI_PYTHON``) and ``mpirun``;
none of them is a project dependency.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from gtopk.reducers.selection.exact import k_for, topk_indices
from tests.bench import authors_compare as ac


def test_each_rank_input_is_deterministic_and_differs_between_ranks():
    a, b = ac.dense_input(10_000, 0), ac.dense_input(10_000, 0)
    assert a.dtype == np.float32 and a.tobytes() == b.tobytes()
    assert not np.array_equal(a, ac.dense_input(10_000, 1))


@pytest.mark.parametrize("m", [269_722, 100_003])
def test_the_sparse_input_is_what_our_reducer_selects(m):
    """What the authors' side feeds their all-reduce is what GTopKReducer selects from the same vector."""
    k = ac.k_of(m, 0.001)
    assert k == k_for(0.001, m)
    for rank in (0, 3):
        x = ac.dense_input(m, rank)
        idx, val = ac.topk_input(x, k)
        assert idx.dtype == np.int64 and np.array_equal(val, x[idx])
        assert np.array_equal(idx, topk_indices(torch.from_numpy(x), k).numpy())


def test_ties_go_to_the_smaller_index_as_in_our_selection():
    x = np.array([1.0, -3.0, 2.0, 3.0, -2.0, 2.0, 0.0], dtype=np.float32)
    assert ac.topk_input(x, 2)[0].tolist() == [1, 3]
    assert ac.topk_input(x, 3)[0].tolist() == [1, 2, 3]
    assert ac.topk_input(np.zeros(5, np.float32), 2)[0].tolist() == [0, 1]


def test_the_digest_is_of_the_set_not_of_the_order():
    idx, val = np.array([5, 1, 9]), np.array([0.5, -1.0, 2.0], np.float32)
    assert ac.digest(idx, val) == ac.digest(idx[::-1], val[::-1])
    assert ac.digest(idx, val) != ac.digest(idx, val * 2)


def test_compare_says_how_two_results_agree():
    idx = np.array([1, 4, 7], np.int64)
    val = np.array([1.0, -2.0, 3.0], np.float32)
    assert ac.compare((idx, val), (idx, val.astype(np.float64))) == "yes (bit for bit)"
    off = val.copy()
    off[1] = np.nextafter(off[1], np.float32(0))
    assert ac.compare((idx, val), (idx, off)).startswith("indices yes; 1 of 3 values differ")
    assert ac.compare((idx, val), (np.array([1, 4, 8]), val)) == "no: 2 indices in one set only"


def _run(side, P, allreduce, selection=None, their_selection=None):
    r = {"side": side, "m": 269722, "P": P, "stem": f"{side}-{P}", "allreduce_ms": {"median": allreduce}}
    if selection is not None:
        r |= {"selection_ms": {"median": selection}, "their_selection_ms": {"median": their_selection}}
    return r


def test_rows_and_table_from_hand_made_runs():
    runs = [_run("ours", 2, 2.0, 1.0, 5.0), _run("authors", 2, 6.0), _run("ours", 2, 4.0, 3.0, 7.0)]
    runs.append(_run("authors", 2, 6.0))
    same = (np.array([3]), np.array([1.0], np.float32))
    rows = ac.rows(runs, lambda r: same)
    assert [(r["part"], r["ours"], r["theirs"], r["ratio"]) for r in rows] == [
        ("all-reduce", 3.0, 6.0, 2.0),
        ("selection", 2.0, 6.0, 3.0),
    ]
    assert rows[0]["ours_range"] == [2.0, 4.0] and rows[1]["theirs_range"] == [5.0, 7.0]
    text = ac.table(rows)
    assert "| 269,722 | 2 | all-reduce | 3.00 (2.00-4.00) | 6.00 (6.00-6.00) | 2.00 | yes (bit for bit) |" in text


def test_a_missing_module_is_stubbed_and_a_present_one_is_not():
    name = "gtopk_no_such_module_for_authors_compare"
    try:
        assert ac.stub_missing((name, "json")) == [name]
        assert sys.modules[name].__dict__.keys() <= {"__name__", "__doc__", "__package__", "__loader__", "__spec__"}
    finally:
        sys.modules.pop(name, None)


def test_the_compressor_is_loaded_from_the_checkout_without_touching_sys_path(tmp_path):
    (tmp_path / "compression.py").write_text("class gTopKCompressor:\n    name = 'gtopk'\n")
    before = list(sys.path)
    assert ac.load_compressor(str(tmp_path)).name == "gtopk"
    assert sys.path == before


@pytest.mark.slow
@pytest.mark.skipif(
    not (os.environ.get("GTOPK_AUTHORS_CHECKOUT") and os.environ.get("GTOPK_MPI_PYTHON") and shutil.which("mpirun")),
    reason="SKIPPED: needs GTOPK_AUTHORS_CHECKOUT, GTOPK_MPI_PYTHON (mpi4py) and mpirun (not project dependencies)",
)
def test_both_sides_end_to_end(tmp_path):
    """Both sides on a small gradient at P = 2: identical results, bit for bit."""
    cmd = [sys.executable, "-m", "tests.bench.authors_compare", "--authors", os.environ["GTOPK_AUTHORS_CHECKOUT"]]
    cmd += ["--mpi-python", os.environ["GTOPK_MPI_PYTHON"], "--m", "70000", "--P", "2", "--calls", "1"]
    cmd += ["--warmup", "0", "--rounds", "1", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, timeout=600)
    rows = json.loads((tmp_path / "table.json").read_text())["rows"]
    assert rows[0]["part"] == "all-reduce" and rows[0]["identical"] == "yes (bit for bit)"
