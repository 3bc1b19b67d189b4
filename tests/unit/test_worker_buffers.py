"""The worker's buffers for large models: gradients as views of one flat buffer
(gtopk.train.flatgrad), the reducers writing the update into a given buffer
(``reduce(grad, out=...)``), the replayed compute's warm-up steps, the weights'
fingerprint (gtopk.train.state) and the per-job peak RSS (gtopk.train.memory)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gtopk.reducers import DenseReducer, GTopKReducer, TopKReducer
from gtopk.train.compute import ReplayedCompute
from gtopk.train.flatgrad import flat_grads, views_intact
from gtopk.train.memory import peak_rss_mb, reset_peak_rss
from gtopk.train.state import _fingerprint


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def loss_of(net: nn.Module, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return net(torch.randn(4, 6, generator=g)).square().sum()


def test_backward_zero_grad_and_sgd_keep_the_gradients_in_the_flat_buffer():
    net, plain = small_net(), small_net()
    flat = flat_grads(list(net.parameters()), torch.device("cpu"))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, fused=True)
    ref_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9, fused=True)
    for step in range(3):
        for o in (opt, ref_opt):
            o.zero_grad(set_to_none=False)
        for seed in (step, step + 10):  # two micro-batches: backward accumulates in place
            loss_of(net, seed).backward()
            loss_of(plain, seed).backward()
        assert views_intact(list(net.parameters()), flat)
        assert torch.equal(flat, torch.cat([p.grad.reshape(-1) for p in plain.parameters()]))
        opt.step()
        ref_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), plain.parameters()))


def test_a_replaced_gradient_or_a_non_fp32_model_is_not_taken_for_a_view():
    net = small_net()
    params = list(net.parameters())
    flat = flat_grads(params, torch.device("cpu"))
    params[1].grad = params[1].grad.clone()
    assert not views_intact(params, flat)
    half = small_net().half()
    params = list(half.parameters())
    flat = flat_grads(params, torch.device("cpu"))
    assert flat.numel() == sum(p.numel() for p in params) and all(p.grad is None for p in params)
    assert not views_intact(params, flat)


REDUCERS = {
    "dense": lambda: DenseReducer(),
    "topk": lambda: TopKReducer(density=0.05),
    "topk-reselect": lambda: TopKReducer(density=0.05, reselect=True),
    "gtopk": lambda: GTopKReducer(density=0.05),
}


@pytest.mark.parametrize("name", sorted(REDUCERS))
def test_the_update_written_over_the_gradient_equals_the_one_in_a_new_tensor(name):
    """One worker (no process group): ``reduce(g, out=g)`` gives, step after step, the
    update and residual that ``reduce(g)`` gives into a new tensor."""
    a, b = REDUCERS[name](), REDUCERS[name]()
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        grad = torch.randn(400, generator=gen)
        buf = grad.clone()
        got, _ = a.reduce(buf, out=buf)
        want, _ = b.reduce(grad)
        assert got is buf and torch.equal(got, want)
        assert a.state_dict().keys() == b.state_dict().keys()
        for key, value in a.state_dict().items():
            assert torch.equal(value, b.state_dict()[key])


def test_an_out_buffer_of_another_size_is_refused():
    with pytest.raises(ValueError, match="out="):
        GTopKReducer(density=0.1).reduce(torch.randn(10), out=torch.empty(11))


def test_replayed_warmup_steps_sleep_only_when_asked():
    quiet = ReplayedCompute(t_compute=0.5, warmup_sleep=False, warmup_steps=2)
    assert [quiet.step_time() for _ in range(4)] == [0.0, 0.0, 0.5, 0.5]
    full = ReplayedCompute(t_compute=0.5, warmup_steps=2)
    assert [full.step_time() for _ in range(3)] == [0.5, 0.5, 0.5]


def test_the_fingerprint_sees_a_one_ulp_change_and_ignores_thread_count():
    net = small_net()
    tensors = list(net.parameters()) + [torch.tensor(3, dtype=torch.int64), torch.ones(3, dtype=torch.float16)]
    before = _fingerprint(tensors)
    with torch.no_grad():
        other = copy.deepcopy(tensors)
        other[0].view(-1)[0] = torch.nextafter(other[0].view(-1)[0], torch.tensor(1.0))
    assert not torch.equal(_fingerprint(other), before)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(_fingerprint(tensors), before)
    finally:
        torch.set_num_threads(threads)


def test_peak_rss_counts_a_touched_allocation_and_restarts_after_a_reset():
    if not reset_peak_rss():
        pytest.skip("this system cannot reset the peak RSS (/proc/self/clear_refs)")
    base = peak_rss_mb()
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, every page touched
    grown = peak_rss_mb()
    assert grown >= base + 60
    del big
    assert reset_peak_rss() and peak_rss_mb() < grown - 50


def test_the_replay_gradient_is_kept_for_the_next_job_of_the_same_model_only():
    import gc
    import weakref

    from gtopk.train.compute import replay_gradient

    cpu = torch.device("cpu")
    first = replay_gradient(1000, 0, 3, 1e-3, cpu)
    gen = torch.Generator().manual_seed(1_000_003 * 1 + 3)
    assert torch.equal(first, torch.randn(1000, generator=gen) * 1e-3)  # the documented draw
    assert replay_gradient(1000, 0, 3, 1e-3, cpu) is first  # the next job of this model
    gone = weakref.ref(first)
    other = replay_gradient(1000, 0, 4, 1e-3, cpu)  # another rank: another vector
    assert not torch.equal(other, first)
    del first
    gc.collect()
    assert gone() is None  # only the last one is kept
