"""A finished run trained longer is the run trained that long from the start: ``run.py`` trains
2 epochs, then the same command with ``train.epochs=3`` extends it in its folder (from the
checkpoint of epoch 1); a job of 3 epochs trained straight, beside it in its own folder,
ends with the same weights (``weights_sha256``), the same per-epoch records and every
rank's losses per iteration, bit for bit. P = 2, gTop-k, on the simulated cluster and on
real worker processes (``cluster=local``, gloo on loopback; slow: ``make test-slow``).

Epochs of 4 steps without cutting them (``train.max_iters_per_epoch`` cuts no extension):
64 digits at 8 x 8, 8 per rank and step, loaders in-process (``train.loader_workers=0``,
what a bit-identical resume needs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gtopk.records.rundir import IDENTITY, RunDir, read_jsonl
from tests.procs import Done, finish, run, start

P, EPOCHS = 2, 3


def job(cluster: str, run_dir: Path, epochs: int) -> list[str]:
    return [
        f"cluster={cluster}",
        "mode=train",
        f"nodes={P}",
        "reducer=gtopk",
        "density=0.01",
        "data=digits",
        "data.image_size=8",
        "data.train_size=64",
        "data.test_size=16",
        "batch_size=8",
        f"train.epochs={epochs}",
        "train.loader_workers=0",
        "threads_per_worker=1",
        "logger.wandb=false",
        f"hydra.run.dir={run_dir}",
    ]


def ok(done: Done) -> Done:
    assert done.returncode == 0 and not done.left, done.stderr[-3000:]
    return done


def losses(run: RunDir) -> dict[int, dict[int, float]]:
    """Every rank's loss per iteration (the latest attempt's where one ran twice)."""
    return {r: {row["iter"]: row["loss"] for row in read_jsonl(run.iters(r))} for r in range(P)}


@pytest.mark.parametrize("cluster", [pytest.param("local", marks=pytest.mark.slow), "simulated"])
def test_a_run_trained_longer_equals_one_trained_straight(cluster, tmp_path):
    ext, whole = RunDir(tmp_path / "extended"), RunDir(tmp_path / "straight")
    straight = start(*job(cluster, whole.path, EPOCHS))  # beside the other: its own folder
    ok(run(*job(cluster, ext.path, EPOCHS - 1)))
    shorter = json.loads(ext.summary.read_text())
    longer = ok(run(*job(cluster, ext.path, EPOCHS)))
    assert f"extending the finished run of {EPOCHS - 1} epochs to {EPOCHS}" in longer.stdout
    assert f"resuming from the checkpoint of epoch {EPOCHS - 2}" in longer.stderr + longer.stdout
    ok(finish(straight))

    got, want = json.loads(ext.summary.read_text()), json.loads(whole.summary.read_text())
    assert got["weights_sha256"] == want["weights_sha256"], "the final weights differ"
    assert got["fingerprint"] == want["fingerprint"] != shorter["fingerprint"]
    assert json.loads((ext.path / IDENTITY).read_text())["fingerprint"] == got["fingerprint"]
    assert read_jsonl(ext.epochs) == read_jsonl(whole.epochs)  # each epoch once, the same values
    assert losses(ext) == losses(whole)
    attempts = read_jsonl(ext.attempts)
    assert "extended" not in attempts[0]
    assert attempts[1]["extended"] == {
        "from_epochs": EPOCHS - 1,
        "to_epochs": EPOCHS,
        "from_fingerprint": shorter["fingerprint"],
    }
    # the second attempt ran only the new epoch's steps
    assert sorted({row["iter"] for row in read_jsonl(ext.iters(0)) if row["attempt"] == 2}) == [8, 9, 10, 11]

    again = ok(run(*job(cluster, ext.path, EPOCHS)))  # the same command once more: finished
    assert "skipping" in again.stdout and len(read_jsonl(ext.attempts)) == 2
