"""A run folder re-run as a user would: a job is bound to the settings that made it. The
same folder with another setting neither skips nor resumes (one line names the setting and
``rerun=true``); ``rerun=true`` moves the old result aside; a finished job is skipped before
any check of the machine; an unreadable summary is quarantined and the job runs again."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from gtopk.records.rundir import SUPERSEDED, RunDir
from gtopk.run.world import listen
from tests.procs import FAST, one_line_error, run, simulated_train

SIMULATED_TRAIN = simulated_train(nodes=2, train_size=96, test_size=16)


@pytest.mark.slow  # in make test: tests/unit/test_identity.py (verdicts, move aside)
def test_a_changed_setting_neither_skips_nor_overwrites_and_rerun_moves_aside(tmp_path):
    d = tmp_path / "job"
    first = run(*FAST, "model.lr=0.1", f"hydra.run.dir={d}")
    assert first.returncode == 0, first.stderr[-2000:]
    old = {n: (d / n).read_bytes() for n in ("summary.json", "config.yaml", "identity.json")}

    other = run(*FAST, "model.lr=0.2", f"hydra.run.dir={d}")
    assert other.returncode == 2, other.stderr[-2000:]
    line = one_line_error(other.stderr)
    assert "model.lr: 0.1 -> 0.2" in line and "rerun=true" in line and "summary.json is of other settings" in line
    assert {n: (d / n).read_bytes() for n in old} == old  # nothing rewritten
    assert not (d / "failed.json").exists()

    again = run(*FAST, "model.lr=0.2", "rerun=true", f"hydra.run.dir={d}")
    assert again.returncode == 0, again.stderr[-2000:]
    (moved,) = (d / SUPERSEDED).iterdir()
    assert {n: (moved / n).read_bytes() for n in old} == old  # the old result, whole
    new = RunDir(d)
    assert new.read_config()["model"]["lr"] == 0.2
    assert new.read_summary()["fingerprint"] != json.loads(old["summary.json"])["fingerprint"]

    # the same settings (timeout_s changes no result) are skipped before any check of the
    # machine: a fixed master_port in use fails validation, and no failed.json is written
    sock = listen("127.0.0.1", 0)
    try:
        same = run(*FAST, "model.lr=0.2", "timeout_s=100", f"master_port={sock.getsockname()[1]}", f"hydra.run.dir={d}")
    finally:
        sock.close()
    assert same.returncode == 0 and "skipping" in same.stdout, same.stderr[-2000:]
    assert not (d / "failed.json").exists()


@pytest.mark.slow  # 18 s; in make test: tests/unit/test_identity.py (the verdict on a checkpoint's fingerprint)
def test_a_checkpoint_of_other_settings_is_not_resumed(tmp_path):
    """A simulated training job stopped after epoch 0's checkpoint; the same folder with
    another learning rate is refused (one line), with the original one it resumes."""
    d = tmp_path / "job"
    stopped = run(*SIMULATED_TRAIN, f"hydra.run.dir={d}", "fault.kind=raise", "fault.rank=1", "fault.at_iter=2")
    assert stopped.returncode == 1, stopped.stderr[-2000:]
    other = run(*SIMULATED_TRAIN, "model.lr=0.05", f"hydra.run.dir={d}")
    assert other.returncode == 2, other.stderr[-2000:]
    line = one_line_error(other.stderr)
    assert "checkpoint is of other settings" in line and "model.lr:" in line and "rerun=true" in line
    resumed = run(*SIMULATED_TRAIN, f"hydra.run.dir={d}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from the checkpoint of epoch 0" in resumed.stdout + resumed.stderr


@pytest.mark.slow  # 14 s; in make test: tests/unit/test_identity.py (quarantine, readers pass it over)
def test_an_unreadable_summary_is_quarantined_and_the_job_runs_again(tmp_path):
    d = tmp_path / "job"
    assert run(*FAST, f"hydra.run.dir={d}").returncode == 0
    (d / "summary.json").write_text('{"images_per_s_per_wor')  # a partial copy
    done = run(*FAST, f"hydra.run.dir={d}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "summary.json is unreadable" in done.stderr and "moved to summary.json.corrupt-" in done.stderr
    assert RunDir(d).read_summary()["images_per_s_per_worker"] > 0
    (corrupt,) = d.glob("summary.json.corrupt-*")
    assert corrupt.read_text() == '{"images_per_s_per_wor'
    assert OmegaConf.load(d / "config.yaml").nodes == 1
