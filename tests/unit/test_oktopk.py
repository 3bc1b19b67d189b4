"""Ok-Topk in one process: settings, the single-worker contract, the P ranks' ``reduce_group``
against the executable specification (``gtopk.reducers.oktopk.reference``) bit for bit,
threshold re-use, the put-back, checkpointed state, the local steps and the cost model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from gtopk.reducers.costmodel import Network
from gtopk.reducers.inprocess import residual_matrix
from gtopk.reducers.oktopk import OkTopKReducer
from gtopk.reducers.oktopk.cost import (
    entry_bytes,
    oktopk_time,
    paper_bound,
    payload_words,
    rank_traffic,
    step_time,
)
from gtopk.reducers.oktopk.reference import OkTopKSpec
from gtopk.reducers.oktopk.regions import balance_plan, boundaries, pad, quantiles, select_local
from gtopk.reducers.selection import Selector
from gtopk.reducers.selection.exact import k_for


@pytest.fixture(autouse=True)
def no_process_group():
    assert not dist.is_initialized(), "these tests need a process without a process group"


def grads_for(P: int, m: int, it: int, ties: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * it + P)
    if ties:  # small integers: many equal magnitudes
        return [torch.randint(-3, 4, (m,), generator=g).float() for _ in range(P)]
    return [torch.randn(m, generator=g) for _ in range(P)]


# -- settings -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"threshold_period": 0}, "reducer.threshold_period=0"),
        ({"threshold_period": 2.5}, "reducer.threshold_period=2.5"),
        ({"threshold_period": True}, "reducer.threshold_period=True"),
        ({"boundary_period": -1}, "reducer.boundary_period=-1"),
        ({"boundary_period": "64"}, "reducer.boundary_period='64'"),
        ({"selection": "fast"}, "reducer.selection='fast'"),
        ({"selection": "sampled", "sample_ratio": 2.0}, "reducer.sample_ratio=2.0"),
        ({"density": 0.0}, "density=0.0"),
    ],
)
def test_every_setting_is_checked_in_one_line(kwargs, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.").replace("(", r"\(")) as err:
        OkTopKReducer(**{"density": 0.01, **kwargs})
    assert "\n" not in str(err.value)


def test_the_paper_s_periods_are_the_defaults():
    r = OkTopKReducer(0.01)
    assert (r.threshold_period, r.boundary_period, r.selection) == (32, 64, "exact")


# -- one worker -----------------------------------------------------------------------------
def test_one_worker_applies_plus_keeps_what_it_accumulated_and_follows_the_spec():
    m, density = 1000, 0.02
    r, spec = OkTopKReducer(density, threshold_period=3, boundary_period=4), OkTopKSpec(1, density, 3, 4)
    residual = torch.zeros(m)
    for it in range(8):
        (g,) = grads_for(1, m, it)
        want, (kept,) = spec.step([residual + g])
        update, rec = r.reduce(g.clone())
        new = r.state_dict()["residual"]
        assert torch.equal(update + new, residual + g), it  # P = 1: nothing lost, nothing added
        assert torch.equal(update, want) and torch.equal(new, kept), it
        assert rec.selected == int(torch.count_nonzero(update))  # one rank: its selection is the update
        residual = new


def test_reference_is_the_next_step_from_the_reducer_s_state():
    r = OkTopKReducer(0.02, threshold_period=3)
    residual = None
    for it in range(5):
        (g,) = grads_for(1, 1000, it)
        want, (kept,) = r.reference([g], [residual])
        update, _ = r.reduce(g.clone())
        residual = r.state_dict()["residual"]
        assert torch.equal(update, want) and torch.equal(residual, kept), it


# -- P ranks in one process against the spec --------------------------------------------------
@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("m,density,ties", [(1000, 0.01, False), (1000, 0.1, True), (37, 0.2, False), (50, 1e-9, True)])
def test_group_equals_the_spec_bit_for_bit(P, m, density, ties):
    workers = [OkTopKReducer(density, threshold_period=3, boundary_period=4) for _ in range(P)]
    spec, residuals = OkTopKSpec(P, density, 3, 4), [torch.zeros(m) for _ in range(P)]
    for it in range(7):  # exact steps 0, 3, 6; regions at 0, 4
        grads = grads_for(P, m, it, ties)
        want, residuals = spec.step([r + g for r, g in zip(residuals, grads)])
        update, recs = OkTopKReducer.reduce_group(workers, [g.clone() for g in grads])
        assert torch.equal(update, want), f"iter {it}: max diff {(update - want).abs().max()}"
        for rank, (w, kept) in enumerate(zip(workers, residuals)):
            assert torch.equal(w.feedback.residual, kept), (it, rank)
            assert recs[rank].selected == len(spec.last["sels"][rank])
        assert [int(b) for b in workers[0].bounds] == spec.bounds
        assert all(r.t_commu == 0 for r in recs)


def test_group_with_gradients_already_in_the_residuals_is_the_same_step():
    P, m, density = 4, 2000, 0.01
    plain = [OkTopKReducer(density, threshold_period=2) for _ in range(P)]
    fused = [OkTopKReducer(density, threshold_period=2) for _ in range(P)]
    for it in range(4):
        grads = grads_for(P, m, it)
        want, _ = OkTopKReducer.reduce_group(plain, [g.clone() for g in grads])
        matrix = residual_matrix(fused)
        if matrix is None:  # the first step: no residuals yet
            got, _ = OkTopKReducer.reduce_group(fused, [g.clone() for g in grads])
        else:  # the batched pass adds the gradients into the residual matrix itself
            matrix.add_(torch.stack(grads))
            got, _ = OkTopKReducer.reduce_group(fused, list(matrix.unbind(0)), accumulated=True)
        assert torch.equal(got, want), it
        for a, b in zip(plain, fused):
            assert torch.equal(a.feedback.residual, b.feedback.residual)


# -- threshold re-use and the put-back --------------------------------------------------------
def test_thresholds_are_reused_between_exact_steps_and_reset_by_a_new_density():
    """Steps 1..3 select by step 0's thresholds (as many entries as pass them, not k);
    step 4 and the step after a density change select exactly k again."""
    P, m, density = 3, 2000, 0.01
    k = k_for(density, m)
    workers = [OkTopKReducer(density, threshold_period=4) for _ in range(P)]
    counts, kept = [], []
    for it in range(6):
        if it == 5:
            for w in workers:
                w.density = 0.02
        grads = grads_for(P, m, it)
        accs = [g if w.feedback.residual is None else w.feedback.residual + g for w, g in zip(workers, grads)]
        _, recs = OkTopKReducer.reduce_group(workers, [g.clone() for g in grads])
        counts.append([r.selected for r in recs])
        kept.append([float(w.local_threshold) for w in workers])
        for w, acc, rec in zip(workers, accs, recs):  # the selection is what the kept threshold passes
            assert rec.selected == int((acc.abs() >= w.local_threshold).sum())
    assert counts[0] == counts[4] == [k] * P and counts[5] == [k_for(0.02, m)] * P
    assert kept[1] == kept[2] == kept[3] == kept[0] != kept[4]
    assert any(c != k for step in counts[1:4] for c in step)  # re-used: not k (with these gradients)


def test_the_put_back_keeps_what_the_global_set_left_out():
    """Rank i clears exactly its selected entries that reached the global set; an entry it
    selected that did not, and one it did not select that did, stay in its residual."""
    P, m, density = 3, 1000, 0.02
    workers = [OkTopKReducer(density, threshold_period=2) for _ in range(P)]
    residuals = [torch.zeros(m) for _ in range(P)]
    for it in range(4):
        grads = grads_for(P, m, it)
        accs = [r + g for r, g in zip(residuals, grads)]
        update, _ = OkTopKReducer.reduce_group(workers, [g.clone() for g in grads])
        final = set(torch.nonzero(update).squeeze(1).tolist())
        total = torch.stack(accs).double().sum(0)
        kept = torch.stack([w.feedback.residual for w in workers]).double().sum(0)
        assert torch.allclose(total, P * update.double() + kept, atol=1e-5)  # nothing lost
        for w, acc in zip(workers, accs):
            selected = set(torch.nonzero(acc.abs() >= w.local_threshold).squeeze(1).tolist())
            cleared = set(torch.nonzero(w.feedback.residual != acc).squeeze(1).tolist())
            assert cleared == {j for j in selected & final if acc[j] != 0}
            assert selected - final and final - selected  # both kinds of kept entries occur
        residuals = [w.feedback.residual.clone() for w in workers]


# -- state ----------------------------------------------------------------------------------
def test_a_restored_state_takes_the_same_next_steps():
    P, m, density = 3, 1000, 0.02
    a = [OkTopKReducer(density, threshold_period=3, boundary_period=2) for _ in range(P)]
    b = [OkTopKReducer(density, threshold_period=3, boundary_period=2) for _ in range(P)]
    assert a[0].state_dict()["residual"] is None
    for it in range(2):
        OkTopKReducer.reduce_group(a, grads_for(P, m, it))
    for x, y in zip(a, b):
        y.load_state_dict(x.state_dict())
    for it in range(2, 7):
        ua, _ = OkTopKReducer.reduce_group(a, grads_for(P, m, it))
        ub, _ = OkTopKReducer.reduce_group(b, grads_for(P, m, it))
        assert torch.equal(ua, ub), it
    saved = a[0].state_dict()
    OkTopKReducer.reduce_group(a, grads_for(P, m, 9))
    assert int(saved["step"]) == 7 and not torch.equal(saved["residual"], a[0].feedback.residual)  # a copy


def test_a_state_of_another_reducer_or_group_size_is_refused():
    r = OkTopKReducer(0.02)
    with pytest.raises(ValueError, match="reducer=oktopk"):
        r.load_state_dict({"residual": None})
    workers = [OkTopKReducer(0.02) for _ in range(3)]
    OkTopKReducer.reduce_group(workers, grads_for(3, 100, 0))
    r.load_state_dict(workers[0].state_dict())
    with pytest.raises(ValueError, match="resume it with nodes=3"):
        r.reduce(torch.randn(100))


# -- the local steps --------------------------------------------------------------------------
def test_regions_average_the_ranks_quantiles():
    # P = 4, m = 100: rank 0 selects 0..7, rank 1 10, 20, ..., 80, rank 2 nothing, rank 3 0, 3, ..., 21
    sels = [torch.arange(8), torch.arange(1, 9) * 10, torch.arange(0), torch.arange(8) * 3]
    proposals = [quantiles(s, 4, 100).tolist() for s in sels]
    assert proposals == [[2, 4, 6], [30, 50, 70], [25, 50, 75], [6, 12, 18]]  # sel[r n / 4]; none: r m / 4
    summed = torch.tensor(proposals).sum(0)  # 63, 116, 169
    assert boundaries(summed, 4, 100).tolist() == [0, 15, 29, 42, 100]


def test_balance_plan_gives_each_rank_its_block():
    # sizes 5, 0, 1, 2 (N = 8, L = 2): rank 0's entries fill blocks 0, 1 and half of 2
    moves = balance_plan([5, 0, 1, 2], 4)
    assert moves == [(0, 0, 0, 0, 2), (0, 1, 2, 0, 2), (0, 2, 4, 0, 1), (2, 2, 0, 1, 1), (3, 3, 0, 0, 2)]
    assert balance_plan([0, 0, 7], 3) == [(2, 0, 0, 0, 3), (2, 1, 3, 0, 3), (2, 2, 6, 0, 1)]


def test_padding_carries_a_sentinel_index_and_zero():
    idx, val = pad(torch.tensor([3, 5]), torch.tensor([1.0, -2.0]), 4)
    assert idx.tolist() == [3, 5, -1, -1] and val.tolist() == [1.0, -2.0, 0.0, 0.0]


def test_local_selection_exact_then_by_threshold():
    acc = torch.tensor([0.5, -3.0, 2.0, -2.0, 0.1, 4.0])
    sel, th = select_local(acc, 3, None, Selector("exact"))
    assert sel.tolist() == [1, 2, 5] and float(th) == 2.0  # ties at 2.0: the smaller index
    again, th2 = select_local(acc, 3, th, None)
    assert again.tolist() == [1, 2, 3, 5] and th2 is th  # every |acc| >= 2.0


# -- the cost model -------------------------------------------------------------------------
def test_rank_traffic_worked_out_by_hand():
    """P = 3, m = 100: rank 0 has 2 entries in region 1, none in region 2; ranks 1 and 2
    send it 1 and 3; the global selection holds 4, 0, 2 entries (N = 6, L = 2)."""
    counts = [[5, 2, 0], [1, 4, 4], [3, 1, 2]]
    t, w = rank_traffic(0, 3, 100, counts, [4, 0, 2], boundary_step=True)
    allreduce = (4, 4 * 8)  # ring all-reduce of 2 int64: 2(P-1) messages of one 8-byte chunk
    gathers = (2 + 2 + 2, 2 * 12 + 2 * 4 + 2 * 16)  # int32 counts (12 bytes), size (4), block (2 entries)
    split, balance = (1, 2 * 8, 4 * 8), (1, 2 * 8, 0)  # to rank 1: its 2 entries; 2 of its 4 to rank 1
    assert t.messages_sent == allreduce[0] + gathers[0] + split[0] + balance[0]
    assert t.bytes_sent == allreduce[1] + gathers[1] + split[1] + balance[1]
    assert t.bytes_recv == allreduce[1] + gathers[1] + split[2] + balance[2]
    assert (w.payload, w.padding, w.meta) == (16 + 16 + 16, 0, 8 * 2 + 4 * (3 + 1))
    _, w2 = rank_traffic(1, 3, 100, counts, [4, 0, 1], boundary_step=False)  # N = 5, L = 2: rank 2 pads 1
    _, w3 = rank_traffic(2, 3, 100, counts, [4, 0, 1], boundary_step=False)
    assert (w2.padding, w3.padding) == (0, 8)


@pytest.mark.parametrize("P", [2, 3, 8, 32, 1024])
def test_the_model_s_entries_stay_below_the_paper_s_bound(P):
    k = 14_728  # VGG-16 at density 0.001
    assert payload_words(P, k) <= 6 * k * (P - 1) / P + 1e-9
    assert payload_words(P, k, balance=False) < payload_words(P, k)
    net = Network(alpha=0.436e-3, beta=9e-9)
    # our schedule's time against the paper's Eq. 3 with its latency terms: the same bandwidth
    # order, more latency (gloo's ring all-gathers: P - 1 messages each)
    ours = step_time(P, k, 14_728_266, net, k)
    bandwidth = ours - step_time(P, k, 14_728_266, Network(net.alpha, 0.0), k)
    meta_and_padding = (P - 1) * (4 * P + 4 + 8) * net.beta
    assert bandwidth <= paper_bound(P, k, 0.0, 4 * net.beta) + meta_and_padding


def test_model_is_zero_alone_and_grows_with_P():
    net = Network(alpha=1e-4, beta=1e-9)
    times = [oktopk_time(P, 100, 100_000, net) for P in (1, 2, 4, 8)]
    assert times[0] == 0 and times[1] < times[2] < times[3]
    assert OkTopKReducer.predict_commu(4, 100_000, net, density=0.001) == oktopk_time(4, 100, 100_000, net)
    assert entry_bytes(2**31) == 12 and math.isclose(paper_bound(2, 10, 1.0, 1.0), 4 + 2 + 30)


# -- the reference at P > 1 and the per-step model (conformance kit findings) -----------------
def test_reference_follows_p_ranks_through_re_used_thresholds():
    """The reference of one instance gives what P ranks do on every step, re-use steps
    included, each rank with its own threshold: against ``reduce_group`` (the P ranks'
    own code), residuals carried from the reference's own previous step."""
    P, m = 3, 600
    workers = [OkTopKReducer(0.02, threshold_period=4, boundary_period=3) for _ in range(P)]
    ref = OkTopKReducer(0.02, threshold_period=4, boundary_period=3)
    kept = None
    for it in range(6):  # exact at 0 and 4: steps 1-3 and 5 re-use thresholds
        grads = grads_for(P, m, it)
        want, kept = ref.reference(grads, kept)
        update, _ = OkTopKReducer.reduce_group(workers, [g.clone() for g in grads])
        assert torch.equal(update, want), it
        for rank, w in enumerate(workers):
            assert torch.equal(w.state_dict()["residual"], kept[rank]), (it, rank)
    thresholds = {float(w.local_threshold) for w in workers}
    assert len(thresholds) == P  # the ranks' thresholds differ: one rank's would not do


def test_reference_without_a_run_says_how_to_start_one():
    r = OkTopKReducer(0.02)
    with pytest.raises(ValueError, match="residuals=None"):
        r.reference([torch.ones(10), torch.ones(10)], [torch.zeros(10), torch.zeros(10)])
    r.reference([torch.ones(10)] * 2, [None, None])  # starts a run of 2
    with pytest.raises(ValueError, match="3 ranks"):
        r.reference([torch.ones(10)] * 3, [torch.zeros(10)] * 3)


@pytest.mark.parametrize("periods", [(32, 64), (3, 4), (5, 5), (1, 1)])
def test_the_average_is_the_mean_of_the_step_model_over_a_run(periods):
    tp, bp = periods
    net, steps = Network(alpha=1.0, beta=0.25), math.lcm(tp, bp)
    for P in (2, 3, 8, 33):
        each = [OkTopKReducer.predict_commu(P, 1000, net, 0.004, tp, bp, step=t) for t in range(steps)]
        avg = OkTopKReducer.predict_commu(P, 1000, net, 0.004, tp, bp)
        assert sum(each) / steps == pytest.approx(avg, rel=1e-12), P
    assert OkTopKReducer.predict_commu(1, 1000, net, 0.004, tp, bp, step=0) == 0.0


def test_step_zero_over_the_average_is_what_the_docs_state():
    """The model's step-0 / average ratio at the schedule check's m, k (docs/oktopk.md), over
    P <= 4,096; the check compares a recorded step 0 with the step-0 model, so its tolerance
    is the data's spread alone."""
    from gtopk.perf import schedulecheck as sc
    from gtopk.reducers.oktopk import DATA_SPREAD, STEP0_OVER_AVERAGE

    Ps = [*range(2, 130), 256, 512, 1000, 1024, 2048, 4095, 4096]
    ratio = max(
        OkTopKReducer.predict_commu(P, sc.M, n, sc.DENSITY, step=0)
        / OkTopKReducer.predict_commu(P, sc.M, n, sc.DENSITY)
        for P in Ps
        for n in sc.NETS
    )
    assert ratio <= STEP0_OVER_AVERAGE < ratio + 0.01
    assert OkTopKReducer.schedule_tolerance == DATA_SPREAD  # the check models step 0 itself
