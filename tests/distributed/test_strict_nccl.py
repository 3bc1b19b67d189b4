"""Our distributed code as NCCL would take it, on gloo (``tests.strict_nccl``): every
reducer (a new ``conf/reducer`` file joins the list by itself) and the DDP baseline
through the training loop, in benchmark and train mode, with measured and replayed
compute; the simulated workers; netbench. A GPU host is faked (``world`` GPUs), each
rank starts its group through ``join_group("nccl")`` (set_device first, ``device_id``),
every tensor a collective gets is checked (device, contiguity, dtype), gloo-only calls
and reduce ops NCCL lacks are refused, and inside each step a factory call of ours
without ``device=`` fails. What only a GPU shows: docs/gpu.md."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from gtopk.run.pool import WorkerGroup
from tests.config import compose_config, options
from tests.strict_workers import as_nccl

P = 2
COMMON = [
    "data=digits",
    "data.image_size=16",
    "data.train_size=160",
    "data.test_size=40",
    "batch_size=8",
    "benchmark.warmup=1",
    "benchmark.iters=2",
    "train.epochs=1",
    "train.max_iters_per_epoch=2",
    "train.loader_workers=0",
    "density=0.01",
    "threads_per_worker=1",
    "device=cpu",
]
#: (reducer choice, more settings): every conf/reducer file, and gTop-k's other schedule
REDUCERS = [(r, []) for r in options("reducer")] + [
    (r, ["reducer.algorithm=recursive_doubling"]) for r in ("gtopk", "gtopk_exact")
]


@pytest.fixture(scope="module")
def group():
    with WorkerGroup(P, timeout=300, threads=1) as g:
        yield g


def run(group: WorkerGroup, tmp_path, task: str, *args) -> list[dict]:
    return group.run(as_nccl, (str(tmp_path / "store"), task, args), threads=1)


def job_config(*settings: str, nodes: int = P) -> dict:
    return OmegaConf.to_container(compose_config([*COMMON, f"nodes={nodes}", *settings]), resolve=True)


@pytest.mark.parametrize("reducer,more", REDUCERS, ids=lambda v: v if isinstance(v, str) else "-".join(v) or "-")
def test_every_reducer_runs_the_loop_as_nccl_takes_it(group, tmp_path, reducer, more):
    results = run(group, tmp_path, "job", job_config(f"reducer={reducer}", *more), str(tmp_path))
    summary = results[0]["out"]
    assert summary["weights_identical_across_ranks"] and summary["iterations"] == 2 * P  # rows of every rank
    for r in results:
        calls = r["calls"]
        assert calls["init_process_group"] == 1
        # the reducer's own traffic went through the checks
        assert calls.get("all_reduce", 0) + calls.get("batch_isend_irecv", 0) + calls.get("send", 0) > 0, calls


@pytest.mark.parametrize(
    "settings",
    [
        ["mode=train", "reducer=gtopk"],
        ["mode=train", "reducer=ddp"],
        ["compute=replay", "compute.t_compute=0.01", "reducer=gtopk"],
    ],
    ids=["train-gtopk", "train-ddp", "replay-gtopk"],
)
def test_training_and_replay_run_as_nccl_takes_them(group, tmp_path, settings):
    """Train mode adds evaluation (all_reduce of sums), checkpoints (a collective load) and
    the density schedule; a replay draws its gradient on the host and moves it."""
    results = run(group, tmp_path, "job", job_config(*settings), str(tmp_path))
    assert results[0]["out"]["weights_identical_across_ranks"]


def test_simulated_workers_touch_no_gpu_and_name_their_devices(group, tmp_path):
    cfg = job_config("mode=train", "reducer=gtopk", "cluster=simulated", nodes=4)
    summary = run(group, tmp_path, "simulated", cfg, str(tmp_path))[0]["out"]
    assert summary["nodes"] == 4


def test_netbench_runs_as_nccl_takes_it(group, tmp_path):
    cfg = OmegaConf.to_container(OmegaConf.load("conf/netbench.yaml"))
    cfg.pop("defaults")
    cfg.update(seed=0, cluster_info={}, pingpong={"sizes": [8, 4096], "reps": 2})
    cfg["collectives"].update(m=[2000], warmup=1, iters=1, latency_reps=2)
    cfg = OmegaConf.to_container(OmegaConf.create({**cfg, "name": "strict", "out": str(tmp_path)}), resolve=True)
    (samples, rows), _ = (r["out"] for r in run(group, tmp_path, "network", cfg))
    assert len(samples) == 2 and {r["reducer"] for r in rows} == set(cfg["collectives"]["reducers"])
