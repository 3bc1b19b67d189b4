"""The payoff's local times of the hook baselines from simulated training runs: one rank's,
not the P virtual ranks' (``analysis.payoff.itertime.training_overheads``).

In a ``cluster=simulated`` run the step's shared part (``t_update``) holds every virtual
rank's hook calls (``gtopk.simulated.hooks.hook_group``); the records below are written by
hand with the numbers such a run leaves, and every expected number is worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.payoff import cli as payoff
from analysis.payoff.itertime import P102, IterTimes, Net
from analysis.training import load_train_runs
from tests.wandb_records import timing_row, write_job

P = 16
PARAMS = 269_722  # ResNet-20 (one input channel), as the fig5_scale summaries say
T_DATA = 0.001  # timing_row's
FP16_GROUP_UPDATE = 0.032  # the simulated step's shared part: 16 ranks' hooks of 2 ms each
DENSE_GROUP_UPDATE = 0.003  # dense's: the sum of the 16 gradients and the SGD step


def train_job(root: Path, reducer: str, nodes: int, backend: str, t_update: float, t_iter: float = 0.2) -> Path:
    """A finished training run of ``reducer`` at ``nodes`` (``backend``: ``in-process`` for
    cluster=simulated), 2 epochs of 5 iterations, every row's t_update ``t_update``."""
    cluster = "simulated" if backend == "in-process" else "emulated"
    over = ["experiment=fig5_scale", f"reducer={reducer}", f"nodes={nodes}", f"cluster={cluster}", "seed=0"]
    rows = {
        rank: [timing_row(rank, it, t_iter, epoch=it // 5, density=1.0, t_update=t_update) for it in range(10)]
        for rank in range(nodes)
    }
    epochs = [{"epoch": e, "train_loss": 1.0, "test_loss": 1.0, "test_top1": 0.5 + e / 10} for e in range(2)]
    summary = {"reducer": reducer, "model": "resnet20", "nodes": nodes, "params": PARAMS, "mode": "train"}
    summary.update(backend=backend, t_iter=t_iter)
    run = root / f"reducer={reducer},nodes={nodes},backend={backend}"
    write_job(run, over, rows, summary, epochs)
    return run


def reducers_of(root: Path) -> dict:
    runs, skipped = load_train_runs([root])
    assert not skipped and runs
    reds, _, _ = payoff.reducers(runs)
    return {label: red for (label, _), red in reds.items()}


def test_a_simulated_hook_baselines_update_is_one_ranks_share(tmp_path):
    train_job(tmp_path, "ddp_fp16", P, "in-process", FP16_GROUP_UPDATE)
    train_job(tmp_path, "dense", P, "in-process", DENSE_GROUP_UPDATE)
    reds = reducers_of(tmp_path)
    fp16 = reds["ddp_fp16"]
    # 16 ranks' hooks in one step's shared part: one rank's is 0.032 / 16
    assert fp16.fallback["t_update"] == pytest.approx(0.002)
    assert fp16.fallback["t_data"] == pytest.approx(T_DATA)
    assert fp16.fallback_from == "training run, t_update / 16 (its 16 simulated ranks' hooks)"
    # dense's group step times each rank's own work elsewhere: its shared part is kept, and
    # DDP (not trained) takes dense's
    for label in ("dense", "ddp"):
        assert reds[label].fallback["t_update"] == pytest.approx(DENSE_GROUP_UPDATE)
        assert reds[label].fallback_from == "training run"


def test_real_ranks_rest_of_the_step_is_kept(tmp_path):
    # a DDP-fp16 run on real ranks: rest = t_iter - t_data - t_compute - t_compr - t_commu
    # = 0.2 - 0.001 - 0.1 - 0.002 - 0.05 (timing_row's parts of a 0.2 s step)
    train_job(tmp_path, "ddp_fp16", 4, "gloo", 0.0)
    fp16 = reducers_of(tmp_path)["ddp_fp16"]
    assert fp16.fallback["t_update"] == pytest.approx(0.047)
    assert fp16.fallback_from == "training run"


def test_fp16_is_not_modelled_slower_than_ddp_on_a_bandwidth_bound_network(tmp_path):
    """The symptom of docs/results.md (P = 16, 32): DDP-fp16 half DDP's bytes, yet slower."""
    train_job(tmp_path, "ddp_fp16", P, "in-process", FP16_GROUP_UPDATE)
    train_job(tmp_path, "dense", P, "in-process", DENSE_GROUP_UPDATE)
    reds = reducers_of(tmp_path)
    net = Net("1 Gbit/s, no latency", alpha=0.0, beta=8e-9, calibrated=False)
    times, compute = IterTimes([]), P102()
    t = {}
    for label in ("ddp", "ddp_fp16"):
        pred, detail = times.modelled("resnet20", PARAMS, reds[label], P, 8, 1, net, compute)
        assert pred is not None, detail
        t[label] = pred
    assert t["ddp_fp16"]["t_update"] == pytest.approx(0.002)
    # same compute, data and check; DDP-fp16's ring all-reduce carries 2 bytes an entry, DDP's 4
    assert t["ddp_fp16"]["t_commu"] == pytest.approx(t["ddp"]["t_commu"] / 2)
    assert t["ddp_fp16"]["t_iter"] < t["ddp"]["t_iter"]
