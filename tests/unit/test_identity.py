"""A job's identity (its resolved config's fingerprint) and what a re-run does with a run
directory: skip, refuse naming the settings that differ, move aside, quarantine."""

from __future__ import annotations

import json
import os

import pytest
from omegaconf import OmegaConf

from gtopk.records.identity import (
    differences,
    fingerprint,
    identity,
    move_aside,
    quarantine,
    verdict,
    write_identity,
)
from gtopk.records.rundir import SUPERSEDED, RunDir, finished, run_dirs


def _ident(compose, *overrides: str) -> dict:
    return identity(compose(list(overrides)))


def test_fingerprint_follows_settings_that_change_a_result(compose):
    base = fingerprint(_ident(compose, "model.lr=0.1"))
    assert fingerprint(_ident(compose, "model.lr=0.1")) == base  # deterministic
    for other in (
        ["model.lr=0.2"],
        ["model.lr=0.1", "seed=1"],
        ["model.lr=0.1", "nodes=2"],
        ["model.lr=0.1", "reducer=dense"],
    ):
        assert fingerprint(_ident(compose, *other)) != base, other
    assert fingerprint(_ident(compose, "model.lr=0.1", "fault.kind=nan")) != base  # NaN + skip changes the result


@pytest.mark.parametrize(
    "neutral",
    [
        "timeout_s=77",
        "collective_timeout_s=9",
        "master_port=12345",
        "logger.wandb=true",
        "logger.progress_every_s=3",
        "name=other",
        "rerun=true",
        "fault.kind=raise",
        "fault.rank=1",
    ],
)
def test_neutral_settings_leave_the_fingerprint(compose, neutral):
    assert fingerprint(_ident(compose, neutral)) == fingerprint(_ident(compose))


def test_a_setting_added_later_at_its_old_behaviour_leaves_the_fingerprint(compose):
    """A record written before ``reducer.selection`` existed (no such key) is the same job as
    one with ``selection: exact``; any other value is another job."""
    cfg = compose([])
    old = OmegaConf.to_container(cfg, resolve=True)
    old["reducer"].pop("selection", None)
    for value, same in (("exact", True), ("sampled", False)):
        new = OmegaConf.to_container(cfg, resolve=True)
        new["reducer"]["selection"] = value
        assert (fingerprint(identity(new)) == fingerprint(identity(old))) is same, value


def test_differences_name_the_keys():
    old = {"model": {"lr": 0.1, "momentum": 0.9}, "seed": 0}
    new = {"model": {"lr": 0.2, "momentum": 0.9}, "seed": 0, "extra": 1}
    assert differences(old, new) == ["extra: '<unset>' -> 1", "model.lr: 0.1 -> 0.2"]
    # an older record (resolved config.yaml): device resolved later, keys only it has are not compared
    assert (
        differences({"device": "cpu", "compute": {"t": 1}, "seed": 0}, {"device": "auto", "seed": 0}, lenient=True)
        == []
    )


def _finish(run_dir, compose, *overrides: str, legacy: bool = False) -> dict:
    """A run directory as a finished job leaves it (config.yaml, identity.json, summary.json)."""
    cfg = compose(list(overrides))
    ident = identity(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    summary = {"images_per_s_per_worker": 12.5, "t_iter": 0.1}
    if not legacy:
        write_identity(run_dir, ident)
        summary["fingerprint"] = fingerprint(ident)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return ident


def test_finished_with_the_same_settings_is_skipped(tmp_path, compose):
    ident = _finish(tmp_path / "job", compose, "model.lr=0.1")
    v = verdict(tmp_path / "job", ident)
    assert (v.action, v.value) == ("skip", 12.5)
    assert verdict(tmp_path / "job", _ident(compose, "model.lr=0.1", "timeout_s=5")).action == "skip"


def test_finished_with_other_settings_is_refused_naming_them(tmp_path, compose):
    _finish(tmp_path / "job", compose, "model.lr=0.1")
    v = verdict(tmp_path / "job", _ident(compose, "model.lr=0.2"))
    assert v.action == "refuse"
    assert "model.lr: 0.1 -> 0.2" in v.why and "rerun=true" in v.why and "\n" not in v.why


def test_a_checkpoint_of_other_settings_is_refused_and_one_of_the_same_resumed(tmp_path, compose):
    run = tmp_path / "job"
    ident = _finish(run, compose, "model.lr=0.1")
    (run / "summary.json").unlink()
    assert verdict(run, ident, fingerprint(ident), has_checkpoint=True).action == "run"
    other = _ident(compose, "model.lr=0.2")
    v = verdict(run, other, fingerprint(ident), has_checkpoint=True)
    assert v.action == "refuse" and "checkpoint" in v.why and "model.lr: 0.1 -> 0.2" in v.why


def test_records_from_before_fingerprints_compare_their_config(tmp_path, compose):
    ident = _finish(tmp_path / "job", compose, "model.lr=0.1", legacy=True)
    assert verdict(tmp_path / "job", ident).action == "skip"
    v = verdict(tmp_path / "job", _ident(compose, "model.lr=0.3"))
    assert v.action == "refuse" and "model.lr: 0.1 -> 0.3" in v.why


def test_an_empty_folder_runs(tmp_path, compose):
    assert verdict(tmp_path / "nothing", _ident(compose)).action == "run"


@pytest.mark.parametrize("text", ["", '{"images_per_s', "[1, 2]", "\x00\x01"])
def test_an_unreadable_summary_is_not_finished_and_is_skipped_by_readers(tmp_path, compose, capfd, text):
    ident = _finish(tmp_path / "a", compose, "model.lr=0.1")
    _finish(tmp_path / "b", compose, "model.lr=0.2")
    (tmp_path / "a" / "summary.json").write_text(text)
    assert verdict(tmp_path / "a", ident).action == "run"
    assert [d.path.name for d in finished([tmp_path])] == ["b"]
    assert RunDir(tmp_path / "a").summary_if_readable() is None
    err = capfd.readouterr().err
    assert "summary.json is unreadable" in err and err.count("\n") == 1


def test_an_unreadable_config_is_passed_over_by_every_reader(tmp_path, compose, capfd):
    _finish(tmp_path / "a", compose)
    _finish(tmp_path / "b", compose)
    (tmp_path / "a" / "config.yaml").write_text("nodes: [1, \n  : :")
    assert [d.path.name for d in run_dirs([tmp_path])] == ["b"]
    assert "config.yaml is unreadable" in capfd.readouterr().err


def test_quarantine_moves_the_record_aside_with_one_line(tmp_path, capfd):
    p = tmp_path / "summary.json"
    p.write_text("{")
    dest = quarantine(p, f"{p} is unreadable (broken)")
    assert not p.exists() and dest.read_text() == "{" and dest.parent == tmp_path
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "moved to summary.json.corrupt-" in err


def test_move_aside_keeps_the_old_result_and_hides_it_from_readers(tmp_path, compose):
    run = tmp_path / "job"
    _finish(run, compose, "model.lr=0.1")
    (run / "checkpoint").mkdir()
    (run / "checkpoint" / "rank0.pt").write_bytes(b"x")
    (run / ".lock").write_text("1\n")
    (run / "run.log").write_text("log\n")
    (run / ".hydra").mkdir()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name not in (".lock", "run.log")}
    dest = move_aside(run)
    assert dest.parent == run / SUPERSEDED
    assert {p.name for p in run.iterdir()} == {".lock", "run.log", ".hydra", SUPERSEDED}
    assert {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()} == before
    assert (dest / "checkpoint" / "rank0.pt").read_bytes() == b"x"
    assert run_dirs([tmp_path]) == [] and finished([tmp_path]) == []
    second = move_aside(run)  # the same second: a folder of its own
    assert second != dest and os.path.isdir(second)
