"""The harness: configs compose, models have the paper's sizes, data loads from real
formats, and run.py jobs leave complete records (end to end, in subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from gtopk.records.rundir import read_jsonl
from gtopk.train.data import Cifar10, DataError, ImageNet
from tests.config import compose_config, options
from tests.datagen import write_cifar10, write_imagefolder

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def composed(overrides: list[str]) -> dict:
    """The resolved job config with the launcher node (as a plain dict)."""
    cfg = compose_config(overrides, hydra=True)
    job = OmegaConf.to_container(cfg)
    job["hydra"] = {"launcher": job["hydra"]["launcher"]}
    return job


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes(experiment):
    cfg = composed([f"experiment={experiment}"])
    assert cfg["name"] == ("default" if experiment == "quick" else experiment)
    if experiment != "quick":  # the paper's per-worker batch, not the quick demo's
        assert cfg["batch_size"] == cfg["model"]["batch_size"][cfg["mode"]]


@pytest.mark.parametrize("group", ["reducer", "model", "data"])
def test_every_group_option_composes(group):
    for opt in options(group):
        cfg = composed([f"{group}={opt}", "mode=train"])
        assert cfg[f"{group}_name"] == opt
        assert "_target_" in cfg[group] or "_target_" in cfg[group].get("net", {})


def test_submitit_slurm_launcher_composes():
    cfg = composed(["hydra/launcher=submitit_slurm"])
    assert cfg["hydra"]["launcher"]["_target_"].endswith("SlurmLauncher")


@pytest.mark.parametrize(
    "model,count", [("vgg16", 14_728_266), ("resnet20", 269_722), ("alexnet", 61_100_840), ("resnet50", 25_557_032)]
)
def test_parameter_counts(model, count):
    cfg = compose_config([f"model={model}"])
    net = instantiate(cfg.model.net)
    assert sum(p.numel() for p in net.parameters()) == count


def test_cifar10_and_imagefolder_load_from_real_formats(tmp_path):
    train, test = Cifar10(str(write_cifar10(tmp_path / "c")), verify=False).datasets()
    assert len(train) == 5 * 64 and len(test) == 64
    x, y = train[0]
    assert x.shape == (3, 32, 32) and 0 <= y < 10
    train, val = ImageNet(str(write_imagefolder(tmp_path / "i"))).datasets()
    assert len(train) == 12 and val[0][0].shape == (3, 224, 224)


def test_missing_or_corrupt_data_names_the_path(tmp_path):
    with pytest.raises(DataError, match=str(tmp_path / "cifar-10-batches-py")):
        Cifar10(str(tmp_path)).check()
    with pytest.raises(DataError, match="ImageNet not found"):
        ImageNet(str(tmp_path)).check()
    write_cifar10(tmp_path)
    with pytest.raises(DataError, match="could not be read"):  # MD5 of generated files
        Cifar10(str(tmp_path), verify=True).datasets()


def run_py(*args: str, timeout: int = 600, **popen) -> subprocess.CompletedProcess:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def test_benchmark_sweep_end_to_end_and_rerun_skips(tmp_path):
    args = [
        "-m",
        f"hydra.sweep.dir={tmp_path}",
        "reducer=dense,topk,gtopk,ddp",
        "nodes=1,3",
        "batch_size=4",
        "benchmark.warmup=1",
        "benchmark.iters=2",
        "data.train_size=64",
        "logger.wandb=false",
        "density=0.01",
    ]
    out = run_py(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p.parent for p in tmp_path.glob("*/summary.json"))
    assert len(jobs) == 8
    for job in jobs:
        s = json.loads((job / "summary.json").read_text())
        P = s["nodes"]
        assert s["params"] == 269_722 and s["density"] == 0.01 and s["mode"] == "benchmark"
        assert s["weights_identical_across_ranks"] and s["iterations"] == 2 * P
        for key in ("t_compute", "t_compr", "t_commu", "t_iter", "images_per_s_per_worker"):
            assert s[key] >= 0, key
        assert s["images_per_s_per_worker"] == pytest.approx(4 / s["t_iter"])
        assert (s["bytes_sent_per_iter"] > 0) == (P > 1)
        assert s["env"]["torch"] == torch.__version__ and s["env"]["device"] == "cpu"
        assert (job / "config.yaml").exists()
        for r in range(P):
            rows = read_jsonl(job / f"iters.rank{r}.jsonl")
            assert [row["iter"] for row in rows] == [0, 1, 2] and rows[0]["warmup"]
    again = run_py(*args)
    assert again.returncode == 0 and again.stdout.count("skipping") == 8


def test_train_on_cifar_format_lowers_the_loss(tmp_path):
    data = write_cifar10(tmp_path / "data", per_batch=128)
    out = run_py(
        "mode=train",
        "nodes=2",
        "reducer=gtopk",
        "density=0.05",
        "data=cifar10",
        f"data.root={data}",
        "data.verify=false",
        "train.epochs=1",
        "train.loader_workers=0",
        "model.batch_size.train=16",
        "model.lr_warmup_epochs=0",
        "model.lr=0.05",
        "logger.wandb=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_jsonl(tmp_path / "run" / "iters.rank0.jsonl")
    losses = [r["loss"] for r in rows]
    assert len(losses) == 5 * 128 // 2 // 16
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4
    epochs = read_jsonl(tmp_path / "run" / "epochs.jsonl")
    assert [e["epoch"] for e in epochs] == [0] and 0 <= epochs[0]["test_top1"] <= 1
    assert rows[0]["density"] == 0.004  # density warm-up in epoch 0


def test_interrupted_training_resumes_from_its_checkpoint(tmp_path):
    data = write_cifar10(tmp_path / "data", per_batch=64)
    args = [
        "mode=train",
        "nodes=2",
        "reducer=topk",
        "density=0.05",
        "data=cifar10",
        f"data.root={data}",
        "data.verify=false",
        "train.epochs=4",
        "train.loader_workers=0",
        "model.batch_size.train=16",
        "logger.wandb=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = dict(os.environ, WANDB_MODE="offline")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ckpt = tmp_path / "run" / "checkpoint"
    deadline = time.monotonic() + 300
    while not ((ckpt / "rank0.pt").exists() and (ckpt / "rank1.pt").exists()):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "run" / "summary.json").exists(), "finished before it could be interrupted"
    done_before = [e["epoch"] for e in read_jsonl(tmp_path / "run" / "epochs.jsonl")]
    out = run_py(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    epochs = [e["epoch"] for e in read_jsonl(tmp_path / "run" / "epochs.jsonl")]
    assert epochs == [0, 1, 2, 3], (done_before, epochs)  # nothing lost, nothing repeated
    assert "resuming from the checkpoint of epoch" in out.stderr
    assert (tmp_path / "run" / "summary.json").exists()


def test_torchrun_world_is_joined_not_spawned(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(ROOT / "run.py"),
            "nodes=2",
            "batch_size=4",
            "benchmark.iters=2",
            "logger.wandb=false",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["nodes"] == 2 and s["iterations"] == 4
    assert (tmp_path / "iters.rank1.jsonl").exists()
