"""Checkpoint generations (``gtopk.train.checkpoint``), in-process: the simulated cluster's
save and resume (``SimulatedRanks.save``/``load``: P = 3 virtual ranks after a real step,
so its files hold real optimiser, residual, BN and RNG states) and the distributed
``Checkpoints`` on a one-process gloo group. Two complete generations are kept; a
generation without its manifest (a kill between two ranks' files) is ignored and removed;
a truncated or corrupted rank file in the newest generation falls back to the one before;
the config fingerprint is stored, returned by ``saved_generation`` and a mismatch refused;
files of the layout before generations resume when they agree; everything loads under
``torch.load(weights_only=True)``. (A job killed at random moments: tests/e2e/test_kill_resume.py.)"""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from baselines.powersgd_state import rng_to_tensors
from gtopk.records.rundir import RunDir
from gtopk.simulated.ranks import SimulatedRanks
from gtopk.simulated.worker import SimulatedWorker
from gtopk.train.checkpoint import Store, check_settings, load_file, saved_generation
from gtopk.train.state import Checkpoints, snapshot

P = 3


_CFG: dict = {}


def simulated(compose, run_dir, fingerprint: str | None = "fp-A", step: bool = False) -> SimulatedRanks:
    """P = 3 virtual ranks of a tiny gTop-k job (``step``: after one step, so that momentum,
    residuals, BN statistics and RNG states are all set)."""
    if not _CFG:
        _CFG["cfg"] = compose(
            [
                "cluster=simulated",
                "mode=train",
                "data=digits",
                "data.image_size=8",
                "data.train_size=96",
                "data.test_size=16",
                "batch_size=4",
                "reducer=gtopk",
                "density=0.01",
                f"nodes={P}",
                "cluster.batched=false",
            ]
        )
    cfg = _CFG["cfg"].copy()
    if fingerprint is not None:
        cfg.fingerprint = fingerprint
    run_dir.mkdir(exist_ok=True)
    w = SimulatedWorker(P, cfg, run_dir, torch.device("cpu"))
    if step:
        streams = [vr.groups(0) for vr in w.ranks]
        w.step([s.__next__ for s in streams], 0.1)
    return SimulatedRanks(w)


def metrics(epoch: int) -> dict:
    return {"epoch": epoch, "train_loss": 1.0 / (epoch + 1), "test_top1": 0.5, "coverage": 0.25}


def generations(run: RunDir) -> list[int]:
    return sorted(int(p.name[5:]) for p in run.checkpoints.glob("epoch*"))


@pytest.fixture
def saved(compose, tmp_path):
    """A simulated job that saved epochs 0, 1 and 2."""
    w = simulated(compose, tmp_path / "run", step=True)
    for epoch in range(3):
        w.save(epoch, metrics(epoch))
    return w


def test_two_generations_are_kept_and_resume_takes_the_newest(saved, compose, tmp_path):
    run = RunDir(tmp_path / "run")
    assert generations(run) == [1, 2]
    manifest = json.loads(run.checkpoint_manifest(2).read_text())
    assert manifest["epoch"] == 2 and manifest["world"] == P and manifest["fingerprint"] == "fp-A"
    assert [(f["rank"], f["file"]) for f in manifest["files"]] == [(r, f"rank{r}.pt") for r in range(P)]
    assert all(f["bytes"] == run.checkpoint(f["rank"], 2).stat().st_size for f in manifest["files"])
    assert saved_generation(run.path)["epoch"] == 2
    for r in range(P):  # the link to the newest; every file loads weights-only (residual, momentum, RNG, metrics)
        assert run.checkpoint(r).is_symlink() and run.checkpoint(r).resolve() == run.checkpoint(r, 2).resolve()
        state = load_file(run.checkpoint(r, 2))
        assert state["reducer"]["residual"] is not None and state["metrics"] == metrics(2)
    again = simulated(compose, tmp_path / "run")
    assert again.load() == (3, metrics(2))
    for vr_a, vr_b in zip(saved.w.ranks, again.w.ranks):  # each rank's own residual, BN statistics and RNG state
        assert torch.equal(vr_a.reducer.state_dict()["residual"], vr_b.reducer.state_dict()["residual"])
        assert all(torch.equal(a, b) for a, b in zip(vr_a.buffers, vr_b.buffers))
        assert torch.equal(vr_a.rng["cpu"], vr_b.rng["cpu"])
    assert all(torch.equal(a, b) for a, b in zip(saved.w.model.parameters(), again.w.model.parameters()))
    again.save(3, metrics(3))
    assert generations(run) == [2, 3]


def test_a_generation_without_manifest_is_ignored_and_removed(saved, compose, tmp_path):
    """A kill between two ranks' files of epoch 3: rank 0's file is there, no manifest."""
    run = RunDir(tmp_path / "run")
    w = saved.w
    with w.active(w.ranks[0]):
        state = snapshot(w.model, w.opt, w.ranks[0].reducer, 3, metrics(3), w.device)
    Store(run, P).write(3, 0, state)
    assert run.checkpoint(0, 3).exists() and not run.checkpoint_manifest(3).exists()
    assert saved_generation(run.path)["epoch"] == 2
    again = simulated(compose, tmp_path / "run")
    assert again.load() == (3, metrics(2))
    assert generations(run) == [1, 2]  # the incomplete generation is gone


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove"])
def test_a_damaged_file_in_the_newest_generation_falls_back_to_the_previous(saved, compose, tmp_path, capsys, damage):
    run = RunDir(tmp_path / "run")
    path = run.checkpoint(1, 2)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # same size: only the sha256 tells
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.unlink()
    assert saved_generation(run.path)["epoch"] == 1
    again = simulated(compose, tmp_path / "run")
    assert again.load() == (2, metrics(1))
    assert "the checkpoint of epoch 2" in capsys.readouterr().err
    assert generations(run) == [1]
    again.save(2, metrics(2))  # the epoch is run again and saved afresh
    assert generations(run) == [1, 2] and saved_generation(run.path)["epoch"] == 2


def test_an_unreadable_manifest_is_named_and_no_readable_generation_is_said(saved, compose, tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    run.checkpoint_manifest(2).write_bytes(b"\xff{not json")
    again = simulated(compose, tmp_path / "run")
    assert again.load() == (2, metrics(1))
    assert "the checkpoint of epoch 2 has an unreadable manifest: passed over" in capsys.readouterr().err
    run.checkpoint(0, 1).write_bytes(b"")  # the last readable generation damaged too
    third = simulated(compose, tmp_path / "run")
    assert third.load()[0] == 0
    assert "no checkpoint generation is readable: training starts again from epoch 0" in capsys.readouterr().err


def test_the_fingerprint_is_stored_and_a_checkpoint_of_other_settings_refused(saved, compose, tmp_path):
    run = RunDir(tmp_path / "run")
    assert saved_generation(run.path)["fingerprint"] == "fp-A"
    other = simulated(compose, tmp_path / "run", fingerprint="fp-B")
    with pytest.raises(RuntimeError, match="fp-A") as e:
        other.load()
    assert "fp-B" in str(e.value)
    assert generations(run) == [1, 2]  # nothing removed
    assert simulated(compose, tmp_path / "run", fingerprint=None).load()[0] == 3  # a caller without one: not compared


def test_a_job_without_fingerprint_stores_none(compose, tmp_path):
    w = simulated(compose, tmp_path / "run", fingerprint=None)
    w.save(0, metrics(0))
    assert saved_generation(tmp_path / "run")["fingerprint"] is None
    assert simulated(compose, tmp_path / "run", fingerprint="fp-B").load()[0] == 1
    assert saved_generation(tmp_path / "empty") is None


def test_files_of_the_layout_before_generations_resume_when_their_epochs_agree(compose, tmp_path):
    w = simulated(compose, tmp_path / "run", step=True).w
    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir()
    for vr in w.ranks:  # as the old Checkpoints.write did: one file per rank, rewritten each epoch
        with w.active(vr):
            torch.save(snapshot(w.model, w.opt, vr.reducer, 4, metrics(4), w.device), run.checkpoint(vr.rank))
    assert saved_generation(run.path) == {
        "format": 0,
        "epoch": 4,
        "world": P,
        "fingerprint": None,
        "legacy": True,
        "files": [],
    }
    again = simulated(compose, tmp_path / "run")
    assert again.load() == (5, metrics(4))
    again.save(5, metrics(5))
    assert generations(run) == [5] and all(run.checkpoint(r).is_symlink() for r in range(P))
    assert saved_generation(run.path)["epoch"] == 5


def test_files_of_the_old_layout_at_different_epochs_are_refused(compose, tmp_path):
    w = simulated(compose, tmp_path / "run").w
    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir()
    for vr in w.ranks:
        with w.active(vr):
            epoch = 4 if vr.rank == 0 else 3  # the old layout's dead end: a kill between two files
            torch.save(snapshot(w.model, w.opt, vr.reducer, epoch, metrics(epoch), w.device), run.checkpoint(vr.rank))
    assert saved_generation(run.path) is None
    with pytest.raises(RuntimeError, match=r"epochs \[4, 3, 3\]"):
        simulated(compose, tmp_path / "run").load()
    for r in (1, 2):  # only rank 0's file: its first save never completed, the job starts afresh (as it did)
        run.checkpoint(r).unlink()
    run.config.write_text(f"nodes: {P}\n")  # how many files saved_generation expects
    assert saved_generation(run.path) is None and simulated(compose, tmp_path / "run").load() == (0, None)


def test_a_powersgd_state_loads_weights_only(tmp_path):
    """The PowerSGD reducer's state (``PowerSGDReducer.state_dict``'s types: settings,
    counters, a numpy RNG as tensors, per-parameter buffers) through a generation."""
    rng = np.random.RandomState(3)
    rng.randn(5)
    reducer = {
        "powersgd": {"matrix_approximation_rank": 2, "warm_start": True, "min_compression_rate": 2.0},
        "iter": 7,
        "totals": (100, 20),
        "rng": rng_to_tensors(rng),
        "params": {0: {"error": torch.randn(6), "p": torch.randn(4), "q": torch.randn(4)}},
    }
    store = Store(RunDir(tmp_path), 1)
    store.commit(0, [store.write(0, 0, {"epoch": 0, "reducer": reducer})], None)
    back = load_file(RunDir(tmp_path).checkpoint(0, 0))["reducer"]
    assert back["totals"] == (100, 20) and torch.equal(back["params"][0]["q"], reducer["params"][0]["q"])
    restored = np.random.RandomState(0)
    restored.set_state(
        (back["rng"]["name"], back["rng"]["keys"].numpy().astype("uint32"), back["rng"]["pos"], *back["rng"]["gauss"])
    )
    assert np.array_equal(restored.randn(3), rng.randn(3))


class _Residual:
    """A reducer's state as the error-feedback reducers keep it."""

    def __init__(self):
        self.residual = torch.zeros(4)

    def state_dict(self) -> dict:
        return {"residual": self.residual.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.residual = state["residual"].clone()


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _worker(seed: int) -> types.SimpleNamespace:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    w = types.SimpleNamespace(model=model, opt=opt, reducer=_Residual(), device=torch.device("cpu"))
    w.reducer.residual = torch.randn(4)
    return w


def test_distributed_checkpoints_on_a_one_process_group(group, tmp_path):
    run = RunDir(tmp_path)
    w, ckpt = _worker(0), Checkpoints(run, 0, 1, "fp-A")
    for epoch in range(3):
        ckpt.save(w, epoch, metrics(epoch))
    assert generations(run) == [1, 2] and saved_generation(tmp_path)["fingerprint"] == "fp-A"
    Store(run, 1).write(3, 0, {"epoch": 3})  # written, never committed
    fresh = _worker(1)
    resumed = Checkpoints(run, 0, 1, "fp-A")
    assert resumed.load(fresh) == 3 and resumed.metrics == metrics(2)
    assert generations(run) == [1, 2]
    assert torch.equal(fresh.reducer.residual, w.reducer.residual)
    assert all(torch.equal(a, b) for a, b in zip(fresh.model.state_dict().values(), w.model.state_dict().values()))
    run.checkpoint(0, 2).write_bytes(run.checkpoint(0, 2).read_bytes()[:-10])  # truncated
    assert Checkpoints(run, 0, 1, "fp-A").load(_worker(2)) == 2 and generations(run) == [1]
    with pytest.raises(RuntimeError, match="fp-A.*fp-B"):
        Checkpoints(run, 0, 1, "fp-B").load(_worker(3))
    with pytest.raises(RuntimeError, match="1 ranks; this job has 2"):
        check_settings(Store(run, 1).manifests(), 2, None, run)
