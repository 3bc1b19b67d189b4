"""Cost-model formulas against values computed by hand."""

from __future__ import annotations

import math

import pytest

from gtopk.reducers import costmodel as cm
from gtopk.reducers.costmodel import Network, Traffic

NET = Network(alpha=1e-3, beta=1e-8)
A, B = NET.alpha, NET.beta


def test_paper_prediction_for_vgg16_at_32_nodes():
    """The paper's notes: about 15 ms predicted for VGG-16 gTop-k at P = 32."""
    m = 14_728_266
    k = int(0.001 * m)
    t = cm.paper_table1(32, m, k, alpha=0.436e-3, beta_word=4 * 9e-9)["gtopk"]
    assert t == pytest.approx(2 * 0.436e-3 * 5 + 4 * k * 36e-9 * 5)
    assert 0.0145 < t < 0.0155
    # our tree + index put-back with 8-byte entries is the same formula at powers of two
    assert cm.gtopk_time(32, k, m, Network.paper(), "tree", "index") == pytest.approx(t)


def test_paper_table1_dense_and_topk():
    t = cm.paper_table1(4, 1000, 10, alpha=A, beta_word=4 * B)
    assert t["dense"] == pytest.approx(6 * A + 1.5 * 1000 * 4 * B)
    assert t["topk"] == pytest.approx(2 * A + 6 * 10 * 4 * B)


def test_dense_ring():
    sizes = [300, 300, 300, 100]  # chunks at P=4: 75, 75, 75, 25
    assert cm.dense_traffic(4, sizes) == Traffic(24, 6000, 6000)
    assert cm.dense_time(4, [1000], NET) == pytest.approx(6 * (A + 250 * 4 * B))
    assert cm.dense_traffic(1, sizes) == Traffic() and cm.dense_time(1, sizes, NET) == 0


def test_topk_allgather():
    assert cm.topk_traffic(5, 10, 1000) == Traffic(4, 4 * 80, 4 * 80)  # ring: P - 1 steps
    assert cm.topk_time(8, 10, 1000, NET) == pytest.approx(7 * A + 7 * 80 * B)
    assert cm.index_bytes(2**31 - 1) == 4 and cm.index_bytes(2**31) == 8


def test_tree_children():
    assert [cm.tree_children(r, 5) for r in range(5)] == [3, 0, 1, 0, 0]
    assert [cm.tree_children(r, 8) for r in range(8)] == [3, 0, 1, 0, 2, 0, 1, 0]


@pytest.mark.parametrize(
    "rank,P,algorithm,putback,want",
    [
        (0, 5, "tree", "index", Traffic(3, 240, 240)),  # receives 3, broadcasts 3
        (4, 5, "tree", "index", Traffic(1, 80, 80)),
        (3, 4, "tree", "exact", Traffic(1 + 2, 80 + 2 * 40, 40 + 2 * 40)),  # up, idx down, 2 RD sums
        (0, 4, "tree", "exact", Traffic(2 + 2, 2 * 40 + 2 * 40, 2 * 80 + 2 * 40)),
        (1, 6, "recursive_doubling", "index", Traffic(3, 240, 240)),  # 2 exchanges + fold
        (5, 6, "recursive_doubling", "index", Traffic(1, 80, 80)),
        (5, 6, "recursive_doubling", "exact", Traffic(2, 80 + 40, 40 + 40)),
        (3, 6, "recursive_doubling", "exact", Traffic(4, 160 + 80, 160 + 80)),
    ],
)
def test_gtopk_traffic_by_hand(rank, P, algorithm, putback, want):
    assert cm.gtopk_traffic(rank, P, 10, 1000, algorithm, putback) == want


def test_gtopk_time_by_hand():
    e, i, v = 80 * B, 40 * B, 40 * B  # entries, indices only, values only (k = 10)
    assert cm.gtopk_time(5, 10, 1000, NET, "tree", "index") == pytest.approx(6 * (A + e))
    assert cm.gtopk_time(4, 10, 1000, NET, "tree", "exact") == pytest.approx(2 * (A + e) + 2 * (A + i) + 2 * (A + v))
    assert cm.gtopk_time(6, 10, 1000, NET, "recursive_doubling", "index") == pytest.approx(4 * (A + e))
    assert cm.gtopk_time(6, 10, 1000, NET, "recursive_doubling", "exact") == pytest.approx(
        (A + e) + 2 * (A + e) + (A + i) + 4 * (A + v)
    )
    assert cm.gtopk_time(1, 10, 1000, NET, "tree", "exact") == 0


def test_gtopk_beats_dense_and_topk_at_scale_in_the_model():
    """Sanity of the model's shape (paper's Table I claim), VGG-16 at rho = 0.001."""
    m, net = 14_728_266, Network.paper()
    k = int(0.001 * m)
    n = math.ceil(m * 4 / 2**20 / 25)
    sizes = [min(25 * 2**18, m - s) for s in range(0, m, 25 * 2**18)]
    assert len(sizes) == n
    for P in (16, 32, 1024):
        g = cm.gtopk_time(P, k, m, net, "tree", "index")
        assert g < cm.topk_time(P, k, m, net) < cm.dense_time(P, sizes, net)


def test_ddp_buckets_follow_backward_order_and_close_at_the_cap():
    # 0.001 MiB = 1048 bytes = 262 fp32 entries; last parameter first
    shapes = [(100,), (10, 20), (50,), (300,)]
    assert cm.ddp_buckets(shapes, 0.001) == [[(300,)], [(50,), (10, 20), (100,)]]
    assert cm.ddp_buckets(shapes, 25.0) == [[(300,), (50,), (10, 20), (100,)]]


def test_ready_offsets_walk_the_layers_backwards():
    # forward 0.1 of 0.3 s, then two weights' layers of 0.1 s each, the last layer first;
    # the bias rides with the weight before it
    ready = cm.ready_offsets([2, 1, 2], t_compute=0.3, forward_share=1 / 3)
    assert ready == [pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.2)]
    assert cm.ready_offsets([1], 0.3, 1 / 3) == [pytest.approx(0.3)]  # no weight: one layer


def test_overlapped_time_waits_for_readiness_and_the_bucket_before():
    assert cm.overlapped_time([0.2, 0.3], [0.068, 0.0288]) == pytest.approx(0.3288)  # the 2nd waits for ready
    assert cm.overlapped_time([0.2, 0.21], [0.068, 0.0288]) == pytest.approx(0.2968)  # for the 1st to end
    assert cm.overlapped_time([], []) == 0.0


def test_ddp_hides_the_buckets_ready_before_backward_ends():
    """Two buckets (cap 4,800 bytes): the last layer's 1,200 entries, ready at 0.2 s, then
    the first layer's 220, ready at 0.3 s = t_compute. P = 2, alpha 10 ms, beta 10 us/byte:
    ring of 1,200 entries = 2 (0.01 + 600 x 4 x 1e-5) = 0.068 s, ends at 0.268 s; of 220 =
    2 (0.01 + 110 x 4 x 1e-5) = 0.0288 s, starts at 0.3 s, ends at 0.3288 s."""
    from baselines.ddp import DDPReducer
    from baselines.fp16 import DDPFp16Reducer

    net, shapes, mb = Network(alpha=0.01, beta=1e-5), [(10, 20), (20,), (30, 40)], 4800 / 2**20
    assert cm.ddp_bucket_indices(shapes, mb) == [[2], [1, 0]]
    assert DDPReducer.predict_commu(2, 1420, net, shapes=shapes, bucket_mb=mb) == pytest.approx(0.068 + 0.0288)
    assert DDPReducer.predict_body(2, 1420, net, 0.3, shapes=shapes, bucket_mb=mb) == pytest.approx(0.3288)
    # one bucket holding everything is ready only when backward ends: nothing hidden
    one = 2 * (0.01 + 710 * 4 * 1e-5)
    assert DDPReducer.predict_body(2, 1420, net, 0.3, shapes=shapes, bucket_mb=25.0) == pytest.approx(0.3 + one)
    # a long backward hides the first bucket entirely: body = t_compute + the last bucket's ring
    assert DDPReducer.predict_body(2, 1420, net, 3.0, shapes=shapes, bucket_mb=mb) == pytest.approx(3.0 + 0.0288)
    # fp16: the same buckets, 2 bytes an entry: 2 (0.01 + 110 x 2 x 1e-5) = 0.0244 for the last one
    assert DDPFp16Reducer.predict_body(2, 1420, net, 3.0, shapes=shapes, bucket_mb=mb) == pytest.approx(3.0 + 0.0244)


def test_powersgd_rule_matches_torchs():
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    for shape in [(64, 3, 3, 3), (10, 512), (512,), (4, 4), (100, 100), (3, 1000)]:
        compressed, n, m, r = cm.powersgd_matrix(shape, 2, 2.0)
        assert (n, m, r) == (shape[0], math.prod(shape) // shape[0], min(shape[0], math.prod(shape) // shape[0], 2))
        assert compressed == _should_compress(n, m, r, 2.0)[0], shape


def test_powersgd_allreduces_and_time_by_hand():
    # rank 2: (64, 27) -> P 64*2, Q 27*2 (182 * 2 = 364 < 1728); (64,) and (4, 4) stay ((4 + 4) * 2 * 2 = 32 > 16)
    bucket = [(64,), (64, 3, 3, 3), (4, 4)]
    assert cm.powersgd_allreduces(bucket, 2, 2.0) == [64 + 16, 128, 54]
    # P = 4: chunks 20, 32, 14 (54/4 rounded up); each all-reduce 6 messages
    want = 6 * (A + 20 * 4 * B) + 6 * (A + 32 * 4 * B) + 6 * (A + 14 * 4 * B)
    assert cm.powersgd_time(4, [bucket], NET, 2, 2.0) == pytest.approx(want)
    # an empty all-reduce costs nothing; two buckets add up
    assert cm.powersgd_time(4, [[(64, 27)], [(64, 27)]], NET, 2, 2.0) == pytest.approx(
        2 * (6 * (A + 32 * 4 * B) + 6 * (A + 14 * 4 * B))
    )
    assert cm.powersgd_time(1, [bucket], NET, 2, 2.0) == 0.0


def test_fp16_is_dense_with_half_the_bytes():
    from baselines.fp16 import DDPFp16Reducer

    m = 1000  # one bucket; chunks of 250 at P = 4
    assert DDPFp16Reducer.predict_commu(4, m, NET) == pytest.approx(6 * (A + 250 * 2 * B))


def test_powersgd_prediction_needs_shapes_and_uses_ddps_buckets():
    from baselines.powersgd import PowerSGDReducer

    with pytest.raises(ValueError, match="shapes"):
        PowerSGDReducer.predict_commu(4, 1728, NET)
    got = PowerSGDReducer.predict_commu(4, 1728 + 64, NET, shapes=[(64, 3, 3, 3), (64,)])
    assert got == pytest.approx(6 * (A + 16 * 4 * B) + 6 * (A + 32 * 4 * B) + 6 * (A + 14 * 4 * B))
