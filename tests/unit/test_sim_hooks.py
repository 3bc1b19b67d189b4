"""The in-process parts of the simulated hook baselines (``gtopk.simulated.hooks``), without
processes: the all-reduce of P virtual ranks, DDP's bucket layouts, the PowerSGD state of
every rank through a checkpoint, and what a job may ask for. (Against torch's hooks in
real DDP: tests/distributed/test_sim_hooks.py.)"""

from __future__ import annotations

import io
import multiprocessing

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

from gtopk.simulated.hooks import HookBucket, InProcessAllReduce, VirtualGroup, ddp_layouts, ready_order
from gtopk.train.models import ResNet20
from tests.distributed.sim_hooks_training import INPUT, Setting, model, reducer, simulated_run
from tests.procs import FAST


def test_the_nth_all_reduces_of_every_rank_pair_and_sum_in_rank_order_in_place():
    reduce = InProcessAllReduce(3)
    groups = [VirtualGroup(r, reduce) for r in range(3)]
    first = [torch.full((2,), float(r + 1)) for r in range(3)]
    # fp16 rounded after each add, in rank order: 2048 + 1 is a tie (to even: 2048), + 1 again;
    # 1 + 2^-11 a tie too (to 1), + 2^-11 again. Summed the other way round: 2050 and 1 + 2^-10.
    second = [torch.tensor(v, dtype=torch.float16) for v in ([2048.0, 1.0], [1.0, 2.0**-11], [1.0, 2.0**-11])]
    works = [dist.all_reduce(first[0], group=groups[0], async_op=True)]
    works.append(dist.all_reduce(second[0], group=groups[0], async_op=True))  # rank 0 runs ahead
    assert not works[0].get_future().done()
    works += [dist.all_reduce(t, group=g, async_op=True) for t, g in zip(first[1:], groups[1:])]
    works += [dist.all_reduce(t, group=g, async_op=True) for t, g in zip(second[1:], groups[1:])]
    values = reduce.wait([w.get_future() for w in works])
    assert all(v[0] is t for v, t in zip(values, [first[0], second[0], first[1], first[2], second[1], second[2]]))
    assert all(t.tolist() == [6.0, 6.0] for t in first)
    assert all(t.tolist() == [2048.0, 1.0] for t in second)
    assert groups[1].size() == 3 and groups[1].rank() == 1


def test_a_failing_rank_ends_the_others_waits_with_its_error():
    """Rank 1's chain fails before its second all-reduce: rank 0, waiting for that
    all-reduce inside a callback, gets the error instead of hanging."""
    reduce = InProcessAllReduce(2)
    groups = [VirtualGroup(r, reduce) for r in range(2)]

    def chain(rank: int) -> torch.futures.Future:
        def then(fut):
            if rank == 1:
                raise RuntimeError("rank 1 broke")
            return dist.all_reduce(torch.ones(1), group=groups[rank], async_op=True).get_future().wait()[0]

        return dist.all_reduce(torch.ones(1), group=groups[rank], async_op=True).get_future().then(then)

    with pytest.raises(RuntimeError, match="rank 1 broke"):
        reduce.wait([chain(0), chain(1)])
    with pytest.raises(RuntimeError, match="failed before"):
        dist.all_reduce(torch.ones(1), group=groups[0], async_op=True)


def test_tensors_of_different_sizes_fail_on_every_rank():
    reduce = InProcessAllReduce(2)
    futs = [reduce.submit(0, torch.ones(2)), reduce.submit(1, torch.ones(3))]
    for f in futs:
        with pytest.raises(RuntimeError, match="different kinds"):
            f.wait()


def test_torchs_fp16_hook_runs_on_the_virtual_ranks():
    reduce = InProcessAllReduce(2)
    grads = [torch.tensor([1.0, 3.0]), torch.tensor([2.0, 5.0])]
    buckets = [HookBucket(0, 1, g.clone(), [torch.nn.Parameter(torch.zeros(2))]) for g in grads]
    futs = [fp16_compress_hook(VirtualGroup(r, reduce), b) for r, b in enumerate(buckets)]
    assert [v.tolist() for v in reduce.wait(futs)] == [[1.5, 4.0]] * 2


def test_the_layouts_are_ddps_for_resnet20():
    """The first pass: one bucket of every parameter in the model's order. Rebuilt: the
    order backward produced the gradients in (a backward pass on the CPU here; the
    distributed test compares with DDP's own buckets), cut by torch's assignment."""
    net = ResNet20(in_channels=1)
    params = list(net.parameters())
    seen = []
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _, i=i: seen.append(i))
    net(torch.randn(2, 1, 8, 8)).sum().backward()
    assert ready_order(net, (1, 8, 8)) == seen != list(reversed(range(len(params))))
    assert all(p.device.type == "cpu" for p in net.parameters())  # the meta pass touched nothing
    first, rebuilt = ddp_layouts(net, (1, 8, 8), 0.1)
    assert first == [list(range(len(params)))]
    assert [i for b in rebuilt for i in b] == seen and len(rebuilt) == 9
    sizes = [sum(params[i].numel() * 4 for i in b) for b in rebuilt]
    assert all(
        s - params[b[-1]].numel() * 4 < 0.1 * 2**20 for s, b in zip(sizes, rebuilt)
    )  # full once the last came in


@pytest.mark.parametrize(
    "options",
    [{}, {"warm_start": False}, {"matrix_approximation_rank": 1}],
    ids=["default", "no-warm-start", "rank1"],
)
def test_powersgd_state_of_every_rank_resumes_from_a_checkpoint(options):
    """Steps 0-5 in one go, against steps 0-2, every rank's ``state_dict`` through
    ``torch.save``/``torch.load(weights_only=True)``, new reducers (a new DDP: the first
    step after it has one bucket, then the rebuilt ones) and steps 3-5. With warm start
    (torch's default) the weights are the uninterrupted run's, bit for bit; without it
    each step draws its Qs per bucket, and the new DDP's first step has other buckets, as
    in a resumed DDP job. Without loading the state, the run differs."""
    setting, P = Setting("powersgd", {"start_powerSGD_iter": 2, **options}, steps=6), 3
    whole = simulated_run(setting, P)
    cut = simulated_run(setting, P, steps=3)
    saved = []
    for w in cut["workers"]:
        buffer = io.BytesIO()
        torch.save(w.state_dict(), buffer)
        saved.append(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert all(s["iter"] == 3 and s["params"] for s in saved)

    def resume(load: bool) -> dict:
        net = model(setting)
        net.load_state_dict(cut["net"].state_dict())
        workers = [reducer(setting) for _ in range(P)]
        type(workers[0]).prepare_group(workers, net, (2, 8, 8))
        for w, state in zip(workers, saved if load else []):
            w.load_state_dict(state)
        return simulated_run(setting, P, start=3, steps=3, workers=workers, net=net)

    resumed = resume(load=True)
    assert resumed["losses"][0] == whole["losses"][3]  # the same weights before the first resumed step
    same = all(a.equal(b) for a, b in zip(whole["weights"], resumed["weights"]))
    assert same == options.get("warm_start", True), options
    assert not any(a.equal(b) for a, b in zip(whole["weights"], resume(load=False)["weights"]))


def test_a_loaded_state_must_come_from_the_same_settings():
    setting = Setting("powersgd")
    run = simulated_run(setting, 2, steps=3)
    other = [reducer(Setting("powersgd", {"matrix_approximation_rank": 1})) for _ in range(2)]
    type(other[0]).prepare_group(other, model(setting), (2, 8, 8))
    with pytest.raises(ValueError, match="PowerSGD settings"):
        other[0].load_state_dict(run["workers"][0].state_dict())


def test_one_virtual_rank_runs_no_hook():
    run = simulated_run(Setting("powersgd", dtype="float32", steps=3), 1)
    assert run["workers"][0].state is None and run["workers"][0].state_dict() == {}
    assert [r[0]["payload_bytes"] for r in run["records"]] == [0] * 3


def test_one_worker_times_powersgds_hook_on_a_twin_and_leaves_its_gradient():
    """With one worker the update is the gradient (no DDP), but PowerSGD's hook runs on a
    twin of the reducer, timed as the step's t_compr: from the third step (start 2) it
    compresses, as the hook of P > 1 ranks does. DDP's own hook computes nothing to time."""
    setting = Setting("powersgd", {"start_powerSGD_iter": 2}, dtype="float32")
    net, psgd, ddp = model(setting), reducer(setting), reducer(Setting("ddp_fp16"))
    for r in (psgd, ddp):
        assert r.wrap(net) is net
        r.time_hook_alone(net, INPUT)
    assert ddp.alone is None and psgd.alone is not None
    m = sum(p.numel() for p in net.parameters())
    grad = torch.randn(m, generator=torch.Generator().manual_seed(0))
    before, twin = grad.clone(), psgd.alone.state
    for step in range(4):
        update, rec = psgd.reduce(grad)
        assert update.equal(before) and grad.equal(before) and rec.payload_bytes == 0
        assert rec.t_compr > 0
        assert ddp.reduce(grad)[1].t_compr == 0
        assert twin.iter == step + 1
        assert (twin.total_numel_after_compression > 0) == (step >= 2)
    assert 0 < twin.total_numel_after_compression < 2 * m  # two compressed steps, each under m


SIMULATED = ["cluster=simulated", "mode=train", "data=digits", "nodes=4"]


@pytest.mark.parametrize("reducer_name", ["powersgd", "ddp_fp16"])
def test_the_hook_baselines_are_accepted_with_cluster_simulated(compose, reducer_name):
    from gtopk.run.execute import validate

    validate(compose([*FAST, *SIMULATED, f"reducer={reducer_name}"]))


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["reducer=powersgd", "grad_accum=2"], ["grad_accum=2", "once per step", "grad_accum=1", "cluster=local"]),
        (["reducer=ddp"], ["reducer=ddp cannot run", "reducer=dense", "cluster=local"]),
        (["reducer=ddp_fp16", "reducer.dtype=bfloat16"], ["reducer.dtype=bfloat16 needs CUDA and NCCL"]),
        (["reducer=powersgd", "reducer.start_powerSGD_iter=1"], ["reducer.start_powerSGD_iter=1 must be >= 2"]),
    ],
)
def test_what_the_simulated_hooks_cannot_run_is_refused_in_one_line(compose, args, fragments):
    from gtopk.run.execute import BAD_INPUT, validate

    with pytest.raises(BAD_INPUT) as info:
        validate(compose([*FAST, *SIMULATED, *args]))
    line = str(info.value)
    assert "\n" not in line and all(f in line for f in fragments), line
    assert not multiprocessing.active_children()
