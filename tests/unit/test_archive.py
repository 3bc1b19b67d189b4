"""Finished jobs archived for git and restored so that a re-run of the sweep skips them."""

from __future__ import annotations

import gzip
import json

from omegaconf import OmegaConf

from gtopk.records.archive import ROWS, main, restore, save
from gtopk.records.identity import fingerprint, identity, verdict, write_identity


def _job(root, compose, *overrides, done=True):
    cfg = compose(["mode=train", *overrides])
    run_dir = root / ",".join(overrides)
    run_dir.mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    ident = identity(cfg)
    write_identity(run_dir, ident)
    (run_dir / "epochs.jsonl").write_text('{"epoch": 0, "test_top1": 0.5}\n')
    for rank in (0, 1):
        rows = [{"iter": i, "rank": rank, "loss": 1.0 / (i + 1 + rank)} for i in range(3)]
        (run_dir / f"iters.rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "checkpoint").mkdir()
    (run_dir / "checkpoint" / "rank0.pt").write_bytes(b"x" * 100)
    if done:
        (run_dir / "summary.json").write_text(json.dumps({"fingerprint": fingerprint(ident), "t_iter": 0.1}))
    return run_dir, ident


def test_save_keeps_what_analysis_reads_and_restore_makes_a_job_the_sweep_skips(tmp_path, compose):
    runs, archive, again = tmp_path / "runs", tmp_path / "archive", tmp_path / "again"
    job, ident = _job(runs, compose, "seed=1")
    _job(runs, compose, "seed=2", done=False)  # unfinished: not archived
    assert [p.name for p in save(runs, archive)] == ["seed=1"]
    kept = sorted(p.name for p in (archive / "seed=1").iterdir())
    assert kept == sorted(["config.yaml", "summary.json", "identity.json", "epochs.jsonl", ROWS])
    with gzip.open(archive / "seed=1" / ROWS, "rb") as f:
        assert f.read() == (job / "iters.rank0.jsonl").read_bytes()
    assert save(runs, archive) == []  # already there with this fingerprint
    assert [p.name for p in restore(archive, again)] == ["seed=1"]
    back = again / "seed=1"
    assert (back / "iters.rank0.jsonl").read_bytes() == (job / "iters.rank0.jsonl").read_bytes()
    assert (back / "summary.json").read_bytes() == (job / "summary.json").read_bytes()
    assert verdict(back, ident).action == "skip"
    assert restore(archive, again) == []


def test_restore_never_writes_over_unfinished_work(tmp_path, compose, capfd):
    runs, archive = tmp_path / "runs", tmp_path / "archive"
    _job(runs, compose, "seed=1")
    save(runs, archive)
    target = tmp_path / "target" / "seed=1"
    target.mkdir(parents=True)
    (target / "iters.rank0.jsonl").write_text('{"iter": 0}\n')
    assert restore(archive, tmp_path / "target") == []
    assert (target / "iters.rank0.jsonl").read_text() == '{"iter": 0}\n'
    assert "holds unfinished work" in capfd.readouterr().err


def test_cli_refuses_a_missing_folder_in_one_line(tmp_path, capfd):
    assert main(["save", str(tmp_path / "nope"), str(tmp_path / "a")]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]
