"""``reducer.selection`` and sampled's settings through ``run.py``: a bad value is one
``error:`` line (exit 2) before any worker starts (the check itself, in-process, is in
``tests/unit/test_selection_sampled.py``)."""

from __future__ import annotations

import pytest

from tests.procs import FAST, one_line_error, run


@pytest.mark.slow  # a run.py start per case (a few seconds each on a loaded machine)
@pytest.mark.parametrize(
    "args,fragment",
    [
        (
            ["reducer=gtopk", "reducer.selection=fast"],
            "reducer.selection='fast' is unknown; choose one of exact, sampled",
        ),
        (
            ["reducer=topk", "reducer.selection=sampled", "+reducer.sample_ratio=0"],
            "reducer.sample_ratio=0 must be a number in (0, 1]",
        ),
    ],
)
def test_bad_selection_is_one_line_before_any_worker(tmp_path, args, fragment):
    done = run(*FAST, *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2, done.stderr[-3000:]
    line = one_line_error(done.stderr)
    assert line.startswith("error: ") and fragment in line, line
    assert "Traceback" not in done.stdout + done.stderr and "workers" not in done.stdout
    assert not list((tmp_path / "run").glob("iters.rank*.jsonl")) and not (tmp_path / "run" / "attempts.jsonl").exists()
    assert not done.left
