"""Damaged checkpoints are said, never passed over in silence: a newest generation whose
manifest is unreadable is named and the older one resumed; when no generation is readable
the job says so, trains from epoch 0 and records every epoch once."""

from __future__ import annotations

import pytest

from gtopk.records.rundir import read_jsonl
from tests.procs import run, simulated_train

TRAIN = simulated_train(nodes=2, epochs=3, train_size=64, test_size=16)


def stopped_in_epoch_2(tmp_path):
    d = tmp_path / "job"
    done = run(*TRAIN, f"hydra.run.dir={d}", "fault.kind=raise", "fault.rank=1", "fault.at_iter=5")
    assert done.returncode == 1, done.stderr[-3000:]
    gens = sorted((d / "checkpoint").glob("epoch*"))
    assert [g.name for g in gens] == ["epoch0", "epoch1"]
    return d, gens


@pytest.mark.slow  # in make test: no readable generation (below); the manifest check: tests/unit/test_checkpoints.py
def test_an_unreadable_newest_manifest_is_named_and_the_older_generation_resumed(tmp_path):
    d, gens = stopped_in_epoch_2(tmp_path)
    (gens[1] / "manifest.json").write_bytes(b"\xff{not json")
    again = run(*TRAIN, f"hydra.run.dir={d}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "the checkpoint of epoch 1 has an unreadable manifest: passed over" in again.stderr
    assert "resuming from the checkpoint of epoch 0" in again.stderr
    assert [e["epoch"] for e in read_jsonl(d / "epochs.jsonl")] == [0, 1, 2]


def test_no_readable_generation_is_said_and_training_starts_again(tmp_path):
    d, gens = stopped_in_epoch_2(tmp_path)
    for g in gens:
        for f in g.glob("rank*.pt"):
            f.write_bytes(f.read_bytes()[:100])
    again = run(*TRAIN, f"hydra.run.dir={d}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "no checkpoint generation is readable: training starts again from epoch 0" in again.stderr
    assert [e["epoch"] for e in read_jsonl(d / "epochs.jsonl")] == [0, 1, 2]  # each once
    assert "Traceback" not in again.stderr
