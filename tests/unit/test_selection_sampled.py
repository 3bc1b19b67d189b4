"""``selection=sampled`` (DGC's sampled threshold) and the selection entry point (local,
no processes): the contract (the n <= k largest, exactly k when at least k pass), every
path (first cut, refinement up to its bound, too many pass, exact fallback), determinism
without the global RNGs, the wire padding, error feedback through the reducers and the
simulated ``reduce_group``, the settings' checks, and the job fingerprint."""

from __future__ import annotations

import random

import pytest
import torch

import gtopk.reducers.selection.exact as selection
from gtopk.reducers import GTopKReducer, TopKReducer, sparse
from gtopk.reducers.selection import Selector, select
from gtopk.reducers.selection.exact import k_for, topk_indices
from gtopk.reducers.selection.sampled import LOWER, sample_stride, sampled_indices, sampled_path
from gtopk.reducers.sparse import pad_to
from tests.unit.test_selection import random_case


def brute_topk(x: torch.Tensor, n: int) -> torch.Tensor:
    """The n largest |x|, ties to the smaller index (a stable sort), ascending."""
    return torch.sort(x.abs(), descending=True, stable=True).indices[:n].sort().values


def check_contract(x: torch.Tensor, k: int, got: torch.Tensor, path: str, passes: int, max_refine: int) -> None:
    """The n largest |x| (ties to the smaller index, ascending int64), 1 <= n <= k; exactly
    k when at least k passed; at least LOWER k unless the refinement stopped short."""
    n = got.numel()
    assert got.dtype == torch.long and 1 <= n <= k
    assert torch.equal(got, brute_topk(x, n)), (path, n, k)
    if path in ("too_many", "exact"):
        assert n == k
    elif n < LOWER * k:  # accepted short only when the bound ran out or the threshold is stuck (inf)
        assert passes == 1 + max_refine or bool(x.abs()[got].min() == float("inf")), (path, passes, n, k)


def test_sampled_contract_on_random_and_adversarial_data():
    g = torch.Generator().manual_seed(11)
    paths = {}
    for _ in range(120):
        m = int(torch.randint(300, 6000, (1,), generator=g))
        x = random_case(g, m)
        for k in {1, max(1, m // 1000), max(1, m // 100), max(1, m // 20)}:
            for max_refine in (0, 2, 10):
                got, path, passes = sampled_path(x, k, 0.01, max_refine)
                check_contract(x, k, got, path, passes, max_refine)
                paths[path] = paths.get(path, 0) + 1
    # the data families must drive every path, or this test does not test them
    assert set(paths) == {"first", "refined", "too_many", "exact"}, paths


def test_too_many_pass_takes_the_k_largest_of_them():
    """Every |x| equal: the threshold passes all m; the k largest (ties: smallest indices)."""
    x = torch.where(torch.rand(5000, generator=torch.Generator().manual_seed(0)) < 0.5, 2.5, -2.5)
    got, path, passes = sampled_path(x, 50, 0.01, 10)
    assert (path, passes) == ("too_many", 1) and torch.equal(got, torch.arange(50))


def test_a_zero_threshold_takes_the_exact_selection():
    """A sample of zeros would pass everything: the exact top-k instead."""
    m, k = 5000, 50
    x = torch.randn(m, generator=torch.Generator().manual_seed(1))
    x[:: sample_stride(m, k)] = 0.0
    got, path, _ = sampled_path(x, k, 0.01, 10)
    assert path == "exact" and torch.equal(got, topk_indices(x, k))


def test_k_equal_to_m_selects_everything():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(9))
    got, path, _ = sampled_path(x, 1000, 0.01, 10)
    assert path == "exact" and torch.equal(got, torch.arange(1000))


def test_refinement_stops_at_its_bound():
    """Large values only where the sample looks (h < LOWER k of them): each lowered
    threshold still passes only those, so the refinement runs out and h are selected."""
    m, k = 20_000, 200
    x = torch.randn(m, generator=torch.Generator().manual_seed(2)) * 1e-3
    stride = sample_stride(m, k)
    h = 40
    x[: h * stride : stride] = 100.0
    for max_refine in (0, 1, 3):
        got, path, passes = sampled_path(x, k, 0.01, max_refine)
        assert passes == 1 + max_refine and got.numel() == h
        assert path == ("first" if max_refine == 0 else "refined")
        assert torch.equal(got, torch.arange(0, h * stride, stride))


def test_refinement_lowers_the_threshold_until_enough_pass():
    """The first cut passes too few (the sample's top entries are planted), one lowering
    by LOWER passes the rest of the large entries: n >= LOWER k after a refinement."""
    m, k = 20_000, 200
    x = torch.randn(m, generator=torch.Generator().manual_seed(3)) * 1e-3
    stride = sample_stride(m, k)
    x[: 40 * stride : stride] = 100.0  # what the sample sees
    x[torch.arange(1, m, 97)[:130]] = 90.0  # off the sample's grid: 40 + 130 >= LOWER k pass at 80
    got, path, passes = sampled_path(x, k, 0.01, 10)
    assert (path, passes, got.numel()) == ("refined", 2, 170)
    assert torch.equal(got, brute_topk(x, 170))


def test_sample_stride_follows_dgc():
    """At least ratio * m entries and 2 m / k (two expected above the k-th), odd stride."""
    for m, k in [(269_722, 269), (14_728_266, 14_728), (5000, 50), (300, 3), (1000, 1), (10, 10)]:
        for ratio in (0.01, 0.1, 1.0):
            s = sample_stride(m, k, ratio)
            n = len(range(0, m, s))
            assert s == 1 or s % 2 == 1
            assert n >= min(m, ratio * m) and n >= min(m, 2 * m / k), (m, k, ratio, s)
            assert s == 1 or len(range(0, m, 2 * s + 1)) < max(ratio * m, 2 * m / k)  # not needlessly small
    assert sample_stride(269_722, 269) == 99 and sample_stride(14_728_266, 14_728) == 99


def test_sampled_is_deterministic_and_draws_from_no_global_rng():
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(4))
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    first = sampled_indices(x, 300)
    assert torch.equal(sampled_indices(x.clone(), 300), first)
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == py_state


def test_sampled_takes_the_candidate_scan_of_other_devices(monkeypatch):
    """CUDA tensors scan with one mask over all of x (``_above_plain``); on CPU the chunked
    scan: both give the same selection (run here by making every CPU vector 'small')."""
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(400_000, generator=g), torch.randint(-50, 51, (400_000,), generator=g).float()]
    want = [sampled_indices(x, 400) for x in xs]
    monkeypatch.setattr(selection, "_CHUNK", 1 << 40)
    for x, w in zip(xs, want):
        assert torch.equal(sampled_indices(x, 400), w)


def test_select_is_the_one_entry_point():
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(6))
    assert torch.equal(select(x, 50), topk_indices(x, 50))
    assert torch.equal(select(x, 50, "exact"), topk_indices(x, 50))
    assert torch.equal(select(x, 50, "sampled"), sampled_indices(x, 50))
    assert torch.equal(select(x, 50, "sampled", sample_ratio=1.0), topk_indices(x, 50))  # the sample is x
    with pytest.raises(ValueError, match="reducer.selection='fast' is unknown; choose one of exact, sampled"):
        select(x, 50, "fast")


@pytest.mark.parametrize("impl", ["cpu", "torch"])
def test_pad_to_fills_with_zeros_at_the_smallest_free_indices(impl, monkeypatch):
    """``torch``: the path of other devices (CUDA), run here on CPU tensors."""
    if impl == "torch":
        monkeypatch.setattr(sparse, "_on_cpu", lambda *t: False)
    idx, val = torch.tensor([0, 2, 7, 9]), torch.tensor([1.0, -2.0, 3.0, -0.5])
    got_idx, got_val, pad = pad_to(idx, val, 7)
    assert got_idx.tolist() == [0, 1, 2, 3, 4, 7, 9]
    assert got_val.tolist() == [1.0, 0.0, -2.0, 0.0, 0.0, 3.0, -0.5]
    assert pad.tolist() == [False, True, False, True, True, False, False]
    same = pad_to(idx, val, 4)
    assert same[0] is idx and same[1] is val and same[2] is None


def test_exact_picks_are_todays_selection():
    """``selection=exact``: the message is the k largest and their values, no padding;
    one rank or P rows at once."""
    acc = torch.randn(4, 70_000, generator=torch.Generator().manual_seed(7))
    one = Selector().pick(acc[0], 70)
    assert torch.equal(one.idx, topk_indices(acc[0], 70)) and torch.equal(one.val, acc[0][one.idx])
    assert one.pad is None and one.own() is one.idx and one.counts() == [70]
    rows = Selector().pick_rows(acc, 70)
    assert rows.pad is None and rows.counts() == [70] * 4
    for i in range(4):
        assert torch.equal(rows.idx[i], topk_indices(acc[i], 70)) and torch.equal(rows.own(i), rows.idx[i])


def test_sampled_pick_rows_is_pick_of_every_row():
    g = torch.Generator().manual_seed(8)
    acc = torch.randn(6, 100_000, generator=g) * torch.rand(6, 1, generator=g)
    sel = Selector("sampled")
    rows = sel.pick_rows(acc, 1000)
    assert rows.pad is not None  # some row selected fewer than k: padded (else the test proves nothing)
    for i in range(6):
        one = sel.pick(acc[i], 1000)
        assert torch.equal(rows.idx[i], one.idx) and torch.equal(rows.val[i], one.val)
        assert torch.equal(rows.own(i), sampled_indices(acc[i], 1000))
        assert rows.counts()[i] == one.own().numel() == one.counts()[0]


# -- through the reducers: error feedback and the simulated reduce_group -------------------

SAMPLED = [
    (TopKReducer, {"reselect": False}),
    (TopKReducer, {"reselect": True}),
    (GTopKReducer, {"putback": "index"}),
    (GTopKReducer, {"putback": "exact"}),
    (GTopKReducer, {"algorithm": "recursive_doubling", "putback": "exact"}),
]


def grads(P: int, m: int, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * it + P)
    return [torch.randn(m, generator=g) * torch.rand(1, generator=g) for _ in range(P)]


@pytest.mark.parametrize("cls,options", SAMPLED, ids=lambda v: getattr(v, "__name__", str(v)))
def test_one_worker_sends_what_it_selected_and_keeps_the_rest(cls, options):
    """P = 1: update + residual == accumulated, bit for bit; the update holds the sampled
    selection (fewer than k in some step) and nothing at the padding."""
    m, density = 100_000, 0.01  # the sample's threshold rank is 11: often fewer than k pass
    r = cls(density=density, selection="sampled", **options)
    residual, short = torch.zeros(m), 0
    for it in range(6):
        g = grads(1, m, it)[0]
        acc = residual + g
        want = sampled_indices(acc, k_for(density, m))
        update, rec = r.reduce(g.clone())
        residual = r.feedback.residual.clone()
        assert rec.selected == want.numel()
        short += want.numel() < k_for(density, m)
        assert torch.equal(update + residual, acc) and torch.equal(update[want], acc[want])
        if options.get("putback") != "exact":  # (exact: a padding index in the final set is applied too)
            assert torch.equal(torch.nonzero(update).squeeze(1), want)
    assert short > 0  # the padding path ran


@pytest.mark.parametrize("cls,options", SAMPLED, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("P", [2, 3])
def test_simulated_group_conserves_and_records_the_selection(cls, options, P):
    """``reduce_group`` with ``selection=sampled``: every rank's record counts its own
    selection, residuals keep what was not applied, and the lossless variants conserve
    (sum of accumulated == P x update + sum of residuals, to float rounding)."""
    m, density = 100_000, 0.01  # the sample's threshold rank is 11: often fewer than k pass
    k = k_for(density, m)
    workers = [cls(density=density, selection="sampled", **options) for _ in range(P)]
    residuals = [torch.zeros(m) for _ in range(P)]
    short = 0
    for it in range(6):
        gs = grads(P, m, it)
        accs = [r + g for r, g in zip(residuals, gs)]
        update, recs = cls.reduce_group(workers, [g.clone() for g in gs])
        residuals = [w.feedback.residual.clone() for w in workers]
        owns = [sampled_indices(a, k) for a in accs]
        assert [rec.selected for rec in recs] == [o.numel() for o in owns]
        short += sum(o.numel() < k for o in owns)
        for acc, res, own in zip(accs, residuals, owns):
            kept = torch.ones(m, dtype=torch.bool)
            kept[own] = False  # putback=exact: and not at the final indices, which every rank sends
            if options.get("putback") == "exact":
                kept[update != 0] = False
            assert torch.equal(res[kept], acc[kept])  # nothing it did not send left it
        if options.get("putback") != "index":  # lossless
            total = torch.stack(accs).double().sum(0)
            assert torch.allclose(P * update.double() + torch.stack(residuals).double().sum(0), total, atol=1e-5)
    assert short > 0


# -- settings: checked when built, one line; the job's fingerprint --------------------------


@pytest.mark.parametrize(
    "settings,fragment",
    [
        ({"selection": "fast"}, "reducer.selection='fast' is unknown; choose one of exact, sampled"),
        ({"selection": "sampled", "sample_ratio": 0}, "reducer.sample_ratio=0 must be a number in (0, 1]"),
        ({"sample_ratio": 1.5}, "reducer.sample_ratio=1.5 must be a number in (0, 1]"),
        ({"sample_ratio": float("nan")}, "reducer.sample_ratio=nan must be a number in (0, 1]"),
        ({"sample_ratio": "a"}, "reducer.sample_ratio='a' must be a number"),
        ({"max_refine": -1}, "reducer.max_refine=-1 must be an integer >= 0"),
        ({"max_refine": 2.5}, "reducer.max_refine=2.5 must be an integer >= 0"),
    ],
)
@pytest.mark.parametrize("cls", [TopKReducer, GTopKReducer])
def test_bad_selection_settings_are_refused_when_built(cls, settings, fragment):
    with pytest.raises(ValueError) as info:
        cls(density=0.01, **settings)
    text = str(info.value)
    assert fragment in text and "\n" not in text and "reducer." in text


def test_bad_selection_is_one_config_error_before_any_worker(compose):
    """The launcher's check (``checks.reducer_settings``, in the parent) names it in one line."""
    from gtopk.run.checks import reducer_settings
    from gtopk.run.settings import ConfigError

    for reducer in ("topk", "gtopk", "gtopk_exact"):
        with pytest.raises(ConfigError) as info:
            reducer_settings(compose([f"reducer={reducer}", "reducer.selection=fast"]))
        assert str(info.value) == "reducer.selection='fast' is unknown; choose one of exact, sampled"
    with pytest.raises(ConfigError, match=r"reducer.max_refine=-2 must be an integer >= 0.*max_refine=10"):
        reducer_settings(compose(["reducer=gtopk", "reducer.selection=sampled", "+reducer.max_refine=-2"]))
    reducer_settings(compose(["reducer=gtopk", "reducer.selection=sampled", "+reducer.sample_ratio=0.05"]))


#: the reducer settings of the existing configs before ``selection`` was added: a job's
#: identity must hold exactly these (so finished jobs are neither re-run nor refused)
BEFORE = {
    "topk": {"_target_": "gtopk.reducers.TopKReducer", "reselect": False},
    "gtopk": {"_target_": "gtopk.reducers.GTopKReducer", "algorithm": "tree", "putback": "index"},
    "gtopk_exact": {"_target_": "gtopk.reducers.GTopKReducer", "algorithm": "tree", "putback": "exact"},
}


@pytest.mark.parametrize("reducer", list(BEFORE))
def test_the_selection_key_leaves_existing_fingerprints(compose, reducer):
    from gtopk.records.identity import fingerprint, identity

    cfg = compose([f"reducer={reducer}"])
    assert cfg.reducer.selection == "exact"  # the key is there, at the default
    ident = identity(cfg)
    assert ident["reducer"] == {**BEFORE[reducer], "density": cfg.density}
    sampled = identity(compose([f"reducer={reducer}", "reducer.selection=sampled"]))
    assert sampled["reducer"]["selection"] == "sampled" and fingerprint(sampled) != fingerprint(ident)
