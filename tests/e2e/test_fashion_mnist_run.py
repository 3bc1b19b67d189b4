"""``run.py data=fashion_mnist`` on the installed Debian package (skipped, with the reason,
where the package is absent): a short training job of two workers on the real 60,000
images resized to 14 x 14, ResNet-20 built for their one channel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gtopk.records.rundir import RunDir, read_jsonl
from gtopk.train.data.fashion_mnist import PACKAGE, ROOT, SPLITS, idx_path
from tests.procs import run

pytestmark = pytest.mark.skipif(
    any(idx_path(Path(ROOT), s, k) is None for s in SPLITS for k in ("images", "labels")),
    reason=f"Fashion-MNIST is not installed under {ROOT} (apt-get install {PACKAGE}, or make setup as root)",
)


@pytest.mark.slow  # 52 s on the shared 2-core machine: two workers each load the 70,000 images
def test_a_short_job_trains_on_the_installed_files(tmp_path):
    done = run(
        "cluster=local",
        "nodes=2",
        "mode=train",
        "reducer=gtopk",
        "density=0.01",
        "data=fashion_mnist",
        "data.image_size=14",
        "data.test_size=256",
        "model=resnet20",
        "batch_size=16",
        "train.epochs=2",
        "train.max_iters_per_epoch=3",
        "train.loader_workers=0",
        "logger.wandb=false",
        f"hydra.run.dir={tmp_path}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(RunDir(tmp_path).summary.read_text())
    assert summary["data"] == "fashion_mnist" and summary["params"] == 269_434  # 1 input channel
    epochs = read_jsonl(RunDir(tmp_path).epochs)
    assert [e["epoch"] for e in epochs] == [0, 1] and all(0 <= e["test_top1"] <= 1 for e in epochs)
    rows = read_jsonl(RunDir(tmp_path).iters(0))
    assert len(rows) == 6 and all(r["update_nnz"] > 0 for r in rows)
    applied = [sum(r["update_nnz"] for r in rows if r["epoch"] <= e) / 269_434 for e in (0, 1)]
    assert [e["coverage"] for e in epochs] == pytest.approx(applied) and summary["coverage"] == pytest.approx(
        applied[1]
    )
    assert not done.left
