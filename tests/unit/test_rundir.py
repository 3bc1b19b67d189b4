"""The run directory's names and the search for finished and failed jobs under a root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gtopk.records.rundir import RunDir, failed, finished, run_dirs


def make_job(path: Path, state: str) -> RunDir:
    """A run directory as a job leaves it: ``state`` is finished, failed or running."""
    run = RunDir(path)
    path.mkdir(parents=True)
    run.config.write_text("name: x\nnodes: 2\n")
    (path / ".hydra").mkdir()
    (path / ".hydra" / "config.yaml").write_text("name: x\n")  # Hydra's copy: not a job
    files = run.wandb / "offline-run-20260101_000000-abc123" / "files"
    files.mkdir(parents=True)
    (files / "config.yaml").write_text("wandb_version: 1\n")  # wandb's copy: not a job
    if state == "finished":
        run.summary.write_text(json.dumps({"nodes": 2}))
    if state == "failed":
        run.failed.write_text(json.dumps({"error": "boom"}))
    return run


def test_jobs_under_a_root_are_found_by_their_files(tmp_path):
    done = make_job(tmp_path / "sweep" / "0", "finished")
    bad = make_job(tmp_path / "sweep" / "1", "failed")
    running = make_job(tmp_path / "sweep" / "2", "running")
    assert run_dirs([tmp_path]) == [done, bad, running]
    assert finished([tmp_path]) == [done] and failed([tmp_path]) == [bad]
    assert done.read_summary() == {"nodes": 2} and done.read_config() == {"name": "x", "nodes": 2}


def test_a_retry_that_finished_is_not_failed(tmp_path):
    run = make_job(tmp_path / "job", "failed")
    run.summary.write_text("{}")
    assert failed([tmp_path]) == [] and finished([tmp_path]) == [run]


def test_the_names_of_a_run_directory(tmp_path):
    run = RunDir(str(tmp_path))
    names = {
        run.config: "config.yaml",
        run.summary: "summary.json",
        run.epochs: "epochs.jsonl",
        run.attempts: "attempts.jsonl",
        run.failed: "failed.json",
        run.lock: ".lock",
        run.wandb: "wandb",
        run.iters(3): "iters.rank3.jsonl",
        run.checkpoint(1): "checkpoint/rank1.pt",
        run.job_log("run"): "run.log",
    }
    for path, name in names.items():
        assert path == tmp_path / name
    for r in (1, 0, 10):
        run.iters(r).write_text("")
    assert run.all_iters() == [tmp_path / f"iters.rank{r}.jsonl" for r in (0, 1, 10)]


def test_read_jsonl_leaves_out_unusable_lines_with_one_warning(tmp_path, capsys):
    from gtopk.records.rundir import read_jsonl

    p = tmp_path / "epochs.jsonl"
    good = [{"epoch": 0, "test_top1": 0.5}, {"epoch": 1, "test_top1": 0.6}]
    bad = [b"\xff\xfe", b"[1, 2]", b"null", b'{"epoch": "x"}', b'{"epoch": 2, "test_top1": Infinity}', b"\0\0"]
    lines = [json.dumps(good[0]).encode(), *bad, json.dumps(good[1]).encode(), b'{"epoch": 3, "te']
    p.write_bytes(b"\n".join(lines))
    assert read_jsonl(p) == good
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(p) in err[0] and "6 unusable line(s)" in err[0]  # the half-written last: silent


def test_a_summary_of_wrong_types_is_unreadable(tmp_path):
    from gtopk.records.rundir import CorruptRecord, RunDir

    run = RunDir(tmp_path)
    run.summary.write_text(json.dumps({"coverage": "x", "t_iter": 0.1}))
    with pytest.raises(CorruptRecord, match="coverage"):
        run.read_summary()
    assert run.summary_if_readable() is None
