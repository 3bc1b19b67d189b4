"""The GPU tier (``make test-gpu``; skipped, with its reason, on a machine with fewer GPUs
than a test needs): P = 1 and 2 on NCCL, every reducer choice and the DDP baseline, three
timed steps each, with NCCL_DEBUG=INFO (make test-gpu sets it) and every step also timed by
CUDA events; netbench's collectives on NCCL; a hung rank on NCCL ending in one line that
names it. What the strict stand-in of ``make test`` checks without a GPU, and what only
this tier shows: docs/gpu.md."""

from __future__ import annotations

import os

import pytest
import torch
from omegaconf import OmegaConf

from gtopk.run.pool import WorkerGroup
from tests.config import compose_config, options
from tests.gpu.workers import network, timed_job
from tests.procs import run

pytestmark = pytest.mark.gpu
REDUCERS = [(r, []) for r in options("reducer")] + [
    (r, ["reducer.algorithm=recursive_doubling"]) for r in ("gtopk", "gtopk_exact")
]
COMMON = ["device=cuda", "backend=nccl", "batch_size=32", "benchmark.warmup=1", "benchmark.iters=3", "density=0.001"]


def need_gpus(n: int) -> None:
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < n:
        pytest.skip(f"needs {n} GPU(s) for NCCL at P = {n}; this machine has {have} (torch.cuda.device_count())")


@pytest.fixture(scope="module", params=[1, 2], ids=lambda p: f"P{p}")
def group(request):
    need_gpus(request.param)
    with WorkerGroup(request.param, backend="nccl", timeout=300) as g:
        yield g


@pytest.mark.parametrize("reducer,more", REDUCERS, ids=lambda v: v if isinstance(v, str) else "-".join(v) or "-")
def test_every_reducer_on_nccl(group, tmp_path, reducer, more):
    """Three timed steps; the host clock (which waits for the GPU) never reads less than
    the GPU's own events say the step took."""
    P = group.nprocs
    cfg = OmegaConf.to_container(compose_config([*COMMON, f"nodes={P}", f"reducer={reducer}", *more]), resolve=True)
    results = group.run(timed_job, (cfg, str(tmp_path)))
    summary = results[0]["summary"]
    assert summary["backend"] == "nccl" and summary["device"].startswith("cuda")
    assert summary["weights_identical_across_ranks"]
    for r in results:
        for host, gpu in r["steps"]:
            print(f"P={P} {reducer}{more}: t_iter {host * 1e3:.2f} ms, CUDA events {gpu * 1e3:.2f} ms")
            assert host >= 0.95 * gpu


def test_netbench_on_nccl(tmp_path):
    need_gpus(2)
    cfg = OmegaConf.to_container(OmegaConf.load("conf/netbench.yaml"))
    cfg.pop("defaults")
    cfg.update(seed=0, cluster_info={}, backend="nccl", device="cuda", name="gpu", out=str(tmp_path))
    cfg["pingpong"].update(reps=3)
    cfg["collectives"].update(m=[269722], warmup=1, iters=3, latency_reps=5)
    with WorkerGroup(2, backend="nccl", timeout=300) as g:
        (samples, rows), _ = g.run(network, (OmegaConf.to_container(OmegaConf.create(cfg), resolve=True),))
    for n, t in samples:
        print(f"NCCL ping-pong {n} B: {t * 1e6:.1f} us one way")
    assert {r["reducer"] for r in rows} == set(cfg["collectives"]["reducers"])


def test_a_hung_rank_on_nccl_is_named_in_one_line(tmp_path):
    """NCCL's blocking wait (gtopk.run.world.NCCL_ENV): the waiting rank raises rather than
    being aborted, and the line names the hung one."""
    need_gpus(2)
    done = run(
        *COMMON,
        "nodes=2",
        "collective_timeout_s=10",
        "fault.kind=hang",
        "fault.rank=1",
        "fault.at_iter=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "rank(s) [1] hung" in done.stderr, done.stderr[-3000:]
    assert not done.left, done.left


def test_a_job_through_run_py_logs_nccl(tmp_path):
    """The user's path: run.py at P = 2 with device=auto picks CUDA and NCCL for measured
    compute; NCCL_DEBUG=INFO shows NCCL's own start-up (its transports) in the job's log."""
    need_gpus(2)
    done = run("nodes=2", "batch_size=32", "benchmark.warmup=1", "benchmark.iters=3", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    log = (tmp_path / "run.log").read_text() + done.stdout + done.stderr
    print(log[-4000:])
    if os.environ.get("NCCL_DEBUG") == "INFO":  # make test-gpu sets it
        assert "NCCL INFO" in log
