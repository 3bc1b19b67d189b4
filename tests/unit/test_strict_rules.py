"""The strict NCCL stand-in (``tests.strict_nccl``) refuses what NCCL would: each rule
broken once, in one process (a world of one on gloo)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gtopk.reducers import reference
from gtopk.run.world import join_group
from gtopk.train.data import SyntheticDataset, build_loader
from tests.strict_nccl import ExplicitDevice, FakeGPUs, NcclRules, Violation, strict


@pytest.fixture
def nccl_world(monkeypatch):
    """A world of one started the way a GPU rank starts (join_group("nccl")), on gloo."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    with strict("cpu", gpus=1) as rules:
        join_group("nccl", 30, 30, store=dist.HashStore(), rank=0, world_size=1)
        try:
            yield rules
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: dist.all_reduce(torch.ones(4, 4, device="cpu").t()), "not dense and contiguous"),
        (lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16, device="cpu")), "NCCL carries no torch.int16"),
        (lambda: dist.all_reduce(torch.ones(4, device="meta")), "not on this rank's device cpu"),
        (lambda: dist.all_reduce(torch.ones(4, dtype=torch.uint8, device="cpu"), op=dist.ReduceOp.BAND), "no such"),
        (lambda: dist.monitored_barrier(), "dist.monitored_barrier exists for gloo only"),
    ],
    ids=["strided", "int16", "other-device", "band", "monitored-barrier"],
)
def test_collectives_refuse_what_nccl_refuses(nccl_world, call, message):
    with pytest.raises(Violation, match=message):
        call()


def test_a_rule_abiding_collective_goes_through(nccl_world):
    t = torch.arange(4, dtype=torch.float32, device="cpu")
    dist.all_reduce(t)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0] and nccl_world.counts["all_reduce"] == 1


@pytest.mark.parametrize(
    "bind,kwargs,message",
    [
        (False, {"device_id": torch.device("cuda", 0)}, "before torch.cuda.set_device"),
        (True, {}, r"device_id=None\), the bound GPU is 1"),
        (True, {"device_id": torch.device("cuda", 0)}, "the bound GPU is 1"),
    ],
)
def test_a_group_needs_its_gpu_bound_first_and_named(bind, kwargs, message):
    with FakeGPUs(2) as gpus, NcclRules("cpu", gpus):
        if bind:
            torch.cuda.set_device(1)
        with pytest.raises(Violation, match=message):
            dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, **kwargs)
        with pytest.raises(Violation, match="backend='gloo'"):
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def test_our_factory_calls_without_a_device_fail_others_do_not():
    with ExplicitDevice():
        with pytest.raises(Violation, match=r"torch.arange without device= at gtopk/reducers/reference.py:\d+"):
            reference.local_topk(torch.ones(5, device="cpu"), 2)
        assert torch.zeros(2).device.type == "cpu"  # not ours (this test)
        assert SyntheticDataset((3, 4, 4), 10, 8, 0).__getitems__([0, 1])  # host-side data, by design


def test_a_cpu_job_that_starts_cuda_fails():
    """On the faked GPU host, pinning (what a CPU rank did before it asked its device) or
    a CUDA tensor starts CUDA: refused."""
    ds = SyntheticDataset((3, 4, 4), 10, 8, 0)
    with FakeGPUs(1):
        with pytest.raises(Violation, match="CUDA was started"):
            torch.zeros(1, device="cuda")
        with pytest.raises(Violation, match="CUDA was started"):
            next(iter(build_loader(ds, 4, 0, 1, True, 0, 0, pin=True)[0]))
