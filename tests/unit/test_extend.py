"""Training a finished run longer in its own folder (``gtopk.records.extension``): when a job
extends the run (``gtopk.run.execute.decide``), when it is refused in one line naming why and
``rerun=true``, the folder name that an epochs override keeps, and the archive's rule (a run
trained longer replaces its shorter copy, never the reverse). Run folders are written here
as a finished job leaves them; the training itself: ``tests/distributed/test_extend_distributed.py``."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from gtopk.records.archive import save
from gtopk.records.extension import Extension, consider
from gtopk.records.identity import fingerprint, identity, write_identity
from gtopk.records.rundir import RunDir
from gtopk.run.execute import OtherSettings, decide
from gtopk.train.checkpoint import Store, saved_generation
from gtopk.train.recipe import first_difference

P, PER_EPOCH = 2, 4  # ranks; iterations per epoch of the finished runs written here
BASE = ["mode=train", f"nodes={P}", "data=digits", "data.image_size=8", "data.train_size=64", "batch_size=8"]


def _cfg(compose, epochs: int, *extra: str):
    return compose([*BASE, f"train.epochs={epochs}", *extra])


def finished(run_dir, compose, epochs: int, *extra: str, checkpoints: tuple[int, ...] | None = None) -> str:
    """A run directory as a finished training job of ``epochs`` epochs leaves it: config,
    identity, rank 0's rows, epochs, summary and checkpoint generations (default: its last
    two epochs'). Returns its fingerprint."""
    cfg = _cfg(compose, epochs, *extra)
    ident, run = identity(cfg), RunDir(run_dir)
    fp = fingerprint(ident)
    run_dir.mkdir(parents=True)
    OmegaConf.save(cfg, run.config, resolve=True)
    write_identity(run_dir, ident)
    rows = [{"iter": e * PER_EPOCH + i, "epoch": e, "rank": 0} for e in range(epochs) for i in range(PER_EPOCH)]
    run.iters(0).write_text("".join(json.dumps(r) + "\n" for r in rows))
    run.epochs.write_text("".join(json.dumps({"epoch": e, "test_top1": 0.5}) + "\n" for e in range(epochs)))
    store = Store(run, P)
    for epoch in (epochs - 2, epochs - 1) if checkpoints is None else checkpoints:
        store.save_all(epoch, [{"epoch": epoch, "w": torch.zeros(2)} for _ in range(P)], fp)
    run.summary.write_text(json.dumps({"fingerprint": fp, "t_iter": 0.1, "images_per_s_per_worker": 1.0}))
    return fp


def judge(run_dir, compose, epochs: int, *extra: str):
    """``consider``'s answer for a job of ``epochs`` epochs (and ``extra``) in ``run_dir``."""
    return consider(
        run_dir, identity(_cfg(compose, epochs, *extra)), saved_generation(run_dir, verify=False), first_difference
    )


def test_a_longer_job_extends_the_finished_run_from_its_last_checkpoint(tmp_path, compose):
    old = finished(tmp_path / "job", compose, 2)
    cfg = _cfg(compose, 3)
    v = decide(tmp_path / "job", identity(cfg), cfg)
    assert v.action == "run" and isinstance(v.extends, Extension)
    assert (v.extends.old_fingerprint, v.extends.old_epochs, v.extends.new_epochs) == (old, 2, 3)
    assert v.extends.attempt() == {"from_epochs": 2, "to_epochs": 3, "from_fingerprint": old}
    # the same job again with the old number of epochs: finished, skipped
    same = _cfg(compose, 2)
    assert decide(tmp_path / "job", identity(same), same).action == "skip"


def test_an_extension_stopped_midway_resumes_from_its_own_checkpoint(tmp_path, compose):
    """The job wrote identity.json (the new identity, the old under ``extends``) and the
    checkpoint of epoch 2 with its own fingerprint; the summary is still the 2-epoch run's."""
    run_dir = tmp_path / "job"
    old = finished(run_dir, compose, 2)
    ident = identity(_cfg(compose, 4))
    first = judge(run_dir, compose, 4)
    assert isinstance(first, Extension)
    write_identity(run_dir, ident, first.carried())
    Store(RunDir(run_dir), P).save_all(2, [{"epoch": 2, "w": torch.ones(2)} for _ in range(P)], fingerprint(ident))
    again = judge(run_dir, compose, 4)
    assert isinstance(again, Extension) and again.old_fingerprint == old and again.old_epochs == 2


def test_a_shorter_job_is_refused_naming_the_epochs_and_rerun(tmp_path, compose):
    finished(tmp_path / "job", compose, 3)
    cfg = _cfg(compose, 2)
    with pytest.raises(OtherSettings) as e:
        decide(tmp_path / "job", identity(cfg), cfg)
    why = str(e.value)
    assert "holds a finished run of 3 epochs; train.epochs=2 would shorten it" in why
    assert "rerun=true" in why and "\n" not in why


def test_without_the_checkpoint_of_its_last_epoch_the_run_is_not_extended(tmp_path, compose):
    finished(tmp_path / "archived", compose, 2, checkpoints=())  # restored from the archive: no checkpoint
    why = judge(tmp_path / "archived", compose, 3)
    assert isinstance(why, str) and "no checkpoint of its last epoch (epoch 1) to continue from (it has none" in why
    assert "rerun=true trains 3 epochs from scratch" in why
    finished(tmp_path / "older", compose, 2, checkpoints=(0,))  # only an older epoch's generation
    why = judge(tmp_path / "older", compose, 3)
    assert isinstance(why, str) and "its newest is of epoch 0" in why


@pytest.mark.parametrize(
    "old, new, where",
    [
        # resnet20's warm-up from lr/P: iteration 0 is lr/P under both; iteration 1 differs
        (["model.lr_warmup_epochs=10"], ["model.lr_warmup_epochs=5"], "the learning rate of epoch 0, iteration 1"),
        # without warm-up, a milestone moved from epoch 1 to 2: epoch 1 trained at lr x 0.1, now at lr
        (
            ["model.lr_warmup_epochs=0", "model.lr_milestones=[1]"],
            ["model.lr_warmup_epochs=0", "model.lr_milestones=[2]"],
            "the learning rate of epoch 1, iteration 0",
        ),
        (["train.density_warmup.epochs=1"], ["train.density_warmup.epochs=0"], "the density of epoch 0"),
    ],
)
def test_a_schedule_that_changes_a_trained_epoch_is_refused(tmp_path, compose, old, new, where):
    finished(tmp_path / "job", compose, 2, *old)
    why = judge(tmp_path / "job", compose, 3, *new)
    assert isinstance(why, str) and "cannot extend exactly" in why and where in why, why
    assert new[-1].split("=")[0] in why and "rerun=true" in why


def test_a_schedule_that_changes_only_new_epochs_extends(tmp_path, compose):
    """A milestone added at the old run's end (epoch 2 of 2) drops the LR only in epochs it
    never trained; with resnet20's 10 warm-up epochs a moved milestone within them changes nothing."""
    finished(tmp_path / "job", compose, 2, "model.lr_warmup_epochs=0", "model.lr_milestones=[1]")
    assert isinstance(
        judge(tmp_path / "job", compose, 3, "model.lr_warmup_epochs=0", "model.lr_milestones=[1,2]"), Extension
    )
    finished(tmp_path / "warm", compose, 2, "model.lr_milestones=[1]")
    assert isinstance(judge(tmp_path / "warm", compose, 3, "model.lr_milestones=[2]"), Extension)


def test_cut_epochs_and_other_settings_are_no_extension(tmp_path, compose):
    finished(tmp_path / "cut", compose, 2, "train.max_iters_per_epoch=3")
    why = judge(tmp_path / "cut", compose, 3, "train.max_iters_per_epoch=3")
    assert isinstance(why, str) and "cut (train.max_iters_per_epoch=3)" in why
    finished(tmp_path / "seed", compose, 2)
    assert judge(tmp_path / "seed", compose, 3, "seed=1") is None  # another cell: the ordinary refusal
    cfg = _cfg(compose, 3, "seed=1")
    with pytest.raises(OtherSettings, match="seed: 0 -> 1"):
        decide(tmp_path / "seed", identity(cfg), cfg)


def test_rerun_moves_an_extendable_run_aside_and_starts_afresh(tmp_path, compose):
    finished(tmp_path / "job", compose, 2)
    cfg = _cfg(compose, 3, "rerun=true")
    v = decide(tmp_path / "job", identity(cfg), cfg, settle=True)
    assert v.action == "run" and v.extends is None and not RunDir(tmp_path / "job").summary.exists()


def test_an_epochs_override_keeps_the_folder_and_a_cut_does_not(compose):
    def folder(*extra: str) -> str:
        return compose([*BASE, *extra], hydra=True).hydra.job.override_dirname

    assert folder("train.epochs=14") == folder("train.epochs=11") == folder()
    assert folder("train.max_iters_per_epoch=3") != folder()


def _archive(runs, archive, capfd) -> tuple[list, str]:
    copied = save(runs, archive)
    return [p.name for p in copied], capfd.readouterr().err


def test_the_archive_keeps_the_run_trained_longest(tmp_path, compose, capfd):
    runs, archive, cell = tmp_path / "runs", tmp_path / "archive", "seed=0"
    two = finished(tmp_path / "two" / cell, compose, 2)
    three = finished(tmp_path / "three" / cell, compose, 3)
    assert _archive(tmp_path / "two", archive, capfd)[0] == [cell]
    # the cell trained longer replaces its archived shorter copy
    assert _archive(tmp_path / "three", archive, capfd)[0] == [cell]
    assert json.loads((archive / cell / "summary.json").read_text())["fingerprint"] == three
    # the shorter copy does not replace it, and says so in one line
    copied, err = _archive(tmp_path / "two", archive, capfd)
    assert copied == [] and json.loads((archive / cell / "summary.json").read_text())["fingerprint"] == three
    assert len(err.strip().splitlines()) == 1 and "trained for 3 epochs" in err and "(2 epochs)" in err
    # another cell's run in the folder (other settings than the epochs) replaces it, as before
    finished(runs / cell, compose, 2, "model.lr=0.05")
    assert _archive(runs, archive, capfd)[0] == [cell] and two != three
