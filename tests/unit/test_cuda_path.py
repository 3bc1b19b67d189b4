"""The CUDA/NCCL path's rules, on this CPU-only machine: the GPU host is faked
(``tests.strict_nccl.FakeGPUs``: device count, set_device, synchronize recorded), the
process group's start intercepted. docs/gpu.md says what this shows and what it cannot."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from gtopk.host import Clock, GPUShortage
from gtopk.perf import netbench
from gtopk.records import compute_profiles
from gtopk.reducers import GTopKReducer, TopKReducer
from gtopk.run import execute, measure_compute
from gtopk.run.checks import ConfigError
from gtopk.run.cluster import emulated
from gtopk.run.world import WorkerError, join_group
from gtopk.train.data import Synthetic, build_loader
from gtopk.train.device import pick_device
from tests.strict_nccl import FakeGPUs

FAST = ["data=synthetic", "data.train_size=64", "batch_size=4"]


class Stop(Exception):
    """Raised by a stand-in to end the call once it has seen what it needs."""


def test_make_test_hides_the_gpus():
    """The default tier is the CPU tier: on a GPU workstation its jobs stay on gloo too
    (tests/conftest.py; make test-gpu runs the GPU tier)."""
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ""


def test_auto_puts_on_the_gpu_only_jobs_that_compute_there(compose):
    """device=auto on a 1-GPU host: a replay at P = 4 (no forward or backward) runs on the
    CPU and passes the checks; real compute goes to CUDA/NCCL; netbench's collectives too
    stay on the CPU unless asked."""
    with FakeGPUs(1):
        replay = compose(["compute=replay", "nodes=4"])
        execute.validate(replay)
        assert execute.placement(replay) == ("cpu", "gloo")
        assert execute.placement(compose(["nodes=1", *FAST])) == ("cuda", "nccl")
        with pytest.raises(ConfigError, match="nodes=2 on device=cuda needs one GPU per worker"):
            execute.validate(compose(["nodes=2", *FAST]))


def test_netbench_refuses_more_nccl_ranks_than_gpus(monkeypatch):
    cfg = OmegaConf.create(
        {"cluster": {"_target_": "gtopk.run.cluster.LocalCluster"}, "device": "cuda", "backend": "nccl", "timeout_s": 5}
    )
    monkeypatch.setattr(netbench, "run_on_cluster", lambda *a, **k: (_ for _ in ()).throw(Stop()))
    with FakeGPUs(1), pytest.raises(ConfigError, match="nodes=2 on device=cuda needs one GPU per worker"):
        netbench._on_cluster(lambda *a: None, 2, cfg, {})


@pytest.mark.parametrize(
    "gpus,settings,message",
    [
        (0, ["device=cuda"], "device=cuda but torch finds no GPU on this machine; use device=cpu"),
        (1, ["device=cpu", "backend=nccl"], "backend=nccl moves GPU tensors only, but device=cpu"),
        (0, ["backend=nccl"], "but device=auto puts them in host memory and this machine has no GPU"),
        (1, ["device=cuda", "backend=gloo"], "backend=gloo with device=cuda"),
        (1, ["device=gpu"], "device='gpu' is unknown; choose one of auto, cpu, cuda"),
    ],
)
@pytest.mark.parametrize("torchrun", [False, True], ids=["spawned", "torchrun"])
def test_device_and_backend_pairs_are_checked_before_any_process(
    compose, monkeypatch, gpus, settings, message, torchrun
):
    if torchrun:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "1")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with FakeGPUs(gpus), pytest.raises(ConfigError, match=message):
        execute.validate(compose(["nodes=1", *FAST, *settings]))


def test_torchrun_with_more_ranks_on_a_machine_than_gpus_is_refused(compose, monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(key, value)
    with FakeGPUs(2), pytest.raises(ConfigError, match="torchrun started 4 ranks on this machine but it has 2 GPU"):
        execute.validate(compose(["nodes=4", *FAST, "device=cuda"]))


def test_a_rank_without_a_gpu_of_its_own_is_refused(monkeypatch):
    """Local rank 2 on a 2-GPU host: no silent sharing of GPU 0 (NCCL: "Duplicate GPU")."""
    cfg = OmegaConf.create({"device": "cuda", "mode": "benchmark"})
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: (_ for _ in ()).throw(Stop()))
    with FakeGPUs(2) as gpus:
        with pytest.raises(GPUShortage, match="local rank 2 needs GPU 2, but this machine has 2 GPU"):
            pick_device(cfg, 2)
        with pytest.raises(GPUShortage, match="local rank 2 needs GPU 2"):
            join_group("nccl", 1, 1, rank=2, world_size=3)
        assert gpus.set_calls == []
        assert pick_device(cfg, 1) == torch.device("cuda", 1) and gpus.set_calls == [1]


def test_an_nccl_group_is_started_on_its_bound_gpu_and_a_timeout_raises(monkeypatch):
    """join_group binds LOCAL_RANK's GPU, then names it as device_id (the communicator is
    built at once); NCCL's blocking wait makes a timed-out collective raise."""
    seen = {}

    def init(backend, **kwargs):
        seen.update(kwargs, backend=backend, bound=list(gpus.set_calls))
        raise Stop()

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    monkeypatch.setattr(dist, "init_process_group", init)
    with FakeGPUs(2) as gpus, pytest.raises(Stop):
        join_group("nccl", 1, 1, rank=3, world_size=4)
    assert seen["device_id"] == torch.device("cuda", 1) and seen["bound"] == [1] and seen["backend"] == "nccl"
    assert os.environ["TORCH_NCCL_BLOCKING_WAIT"] == "1"


def test_the_one_line_failure_names_the_hung_rank():
    """Rank 0 timed out waiting in a collective; rank 1 was still running: rank 1 hung."""
    error = WorkerError(
        {
            0: "Traceback (most recent call last):\ntorch.distributed.DistBackendError: [Rank 0] Work "
            "WorkNCCL(SeqNum=7, OpType=ALLREDUCE) timed out in blocking wait (TORCH_NCCL_BLOCKING_WAIT=1).",
            1: f"{WorkerError.STOPPED} still running when the group was stopped (another rank failed first)",
        }
    )
    assert error.summary().startswith("rank(s) [1] hung: still running when rank(s) [0] timed out waiting")
    gloo = WorkerError(
        {0: "RuntimeError: [unbound_buffer.cc:81] Timed out waiting 5000ms for recv", 1: error.failures[1]}
    )
    assert gloo.summary().startswith("rank(s) [1] hung")


def test_a_cpu_rank_on_a_gpu_host_pins_no_memory():
    """Pinning creates a CUDA context and counts in t_data: only for a GPU rank."""
    ds = Synthetic([3, 8, 8], 10, train_size=32, test_size=8).datasets()[0]
    with FakeGPUs(1):
        loader, _ = build_loader(ds, 4, 0, 1, True, 0, 0)
        assert loader.pin_memory is False
        assert build_loader(ds, 4, 0, 1, True, 0, 0, pin=True)[0].pin_memory is True


def test_training_on_cuda_uses_deterministic_kernels(monkeypatch):
    """Bit-identity (simulated against distributed, resumed against uninterrupted) on CUDA
    rests on cuDNN's and cuBLAS's deterministic kernels; benchmarks keep the fast ones."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        with FakeGPUs(1):
            pick_device(OmegaConf.create({"device": "cuda", "mode": "benchmark"}), 0)
            assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
            pick_device(OmegaConf.create({"device": "cuda", "mode": "train"}), 0)
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    "cls,options", [(TopKReducer, {}), (GTopKReducer, {"putback": "index"}), (GTopKReducer, {"putback": "exact"})]
)
def test_simulated_workers_time_with_the_device_clock(monkeypatch, cls, options):
    """t_compr and t_merge of the in-process reduce come from gtopk.host.Clock (which waits
    for the device's queued work), not from a bare perf_counter: with a clock that ticks
    one second per reading they are whole seconds, or whole seconds shared equally by the
    P ranks (the selection, made for all ranks at once: each rank gets 1/P of it)."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(Clock, "__call__", lambda self: float(next(ticks)))
    P = 4
    workers = [cls(density=0.1, **options) for _ in range(P)]
    grads = [torch.randn(100, generator=torch.Generator().manual_seed(r)) for r in range(P)]
    _, recs = cls.reduce_group(workers, grads)
    for rec in recs:
        assert rec.t_compr >= 1 / P and rec.t_compr * P == int(rec.t_compr * P)
        assert rec.t_merge == int(rec.t_merge)
    assert sum(rec.t_merge for rec in recs) >= (1 if cls is GTopKReducer else 0)


def test_the_emulated_network_turns_off_every_nccl_bypass():
    """NVLink SHARP (NVSwitch hosts) and CollNet would bypass the shaped link as P2P, SHM
    and InfiniBand would."""
    for key in ("NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        assert emulated.RANK_ENV[key] == "1"
    assert emulated.RANK_ENV["NCCL_NVLS_ENABLE"] == "0" and emulated.RANK_ENV["NCCL_COLLNET_ENABLE"] == "0"
    assert emulated.RANK_ENV["NCCL_SOCKET_IFNAME"] == emulated.IFNAME


def test_the_clock_waits_for_its_own_gpu():
    with FakeGPUs(2) as gpus:
        Clock(torch.device("cuda", 1))()
        Clock(torch.device("cpu"))()
    assert gpus.synced == [torch.device("cuda", 1)]


def test_the_local_profile_measures_on_the_jobs_backend(compose, monkeypatch, tmp_path):
    """A CUDA job's compute profile is measured on CUDA with NCCL, not gloo."""
    specs = []

    def run_on_cluster(spec, *_, **__):
        specs.append(spec)
        raise Stop()

    monkeypatch.setattr(measure_compute, "run_on_cluster", run_on_cluster)
    monkeypatch.setattr(compute_profiles, "LOCAL_PROFILE", tmp_path / "local.json")
    cfg = compose(["nodes=1", *FAST, "device=cuda"])
    with FakeGPUs(1), pytest.raises(Stop):
        measure_compute.measure_local(cfg)
    assert (specs[0].device, specs[0].backend) == ("cuda", "nccl")
