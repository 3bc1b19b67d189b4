"""PowerSGD's communication model: every ring step of the hook's all-reduces costs alpha +
max(software, its chunk's wire time), so the measured per-message software cost shows in
its small, latency-bound all-reduces; DDP's all-reduces keep bare alpha. Values computed by
hand."""

from __future__ import annotations

import pytest

from baselines.ddp import DDPReducer
from baselines.powersgd import PowerSGDReducer
from gtopk.reducers import costmodel as cm
from gtopk.reducers.costmodel import Network

A, B, S = 1e-3, 1e-8, 4e-4  # alpha, beta, software: made-up round numbers
NET = Network(alpha=A, beta=B, software=S)
#: rank 2: (64, 3, 3, 3) -> P 64 x 2, Q 27 x 2; (64,) and (4, 4) are all-reduced as they are
BUCKET = [(64,), (64, 3, 3, 3), (4, 4)]


def test_software_ring_time_by_hand():
    # 10 elements at P = 2: chunks of 5 (20 bytes, 2e-7 s on the wire < S): 2 steps of A + S
    assert cm.software_ring_time(2, 10, NET) == pytest.approx(2 * (A + S))
    # 200,000 elements at P = 2: chunks of 100,000 (4e-3 s on the wire > S): the wire time
    assert cm.software_ring_time(2, 200_000, NET) == pytest.approx(2 * (A + 100_000 * 4 * B))
    # P = 4, 30 elements: chunks of 8 (padded), 6 steps; 2-byte words change only the wire time
    assert cm.software_ring_time(4, 30, NET) == pytest.approx(6 * (A + S))
    assert cm.software_ring_time(4, 4_000_000, NET, word=2) == pytest.approx(6 * (A + 1_000_000 * 2 * B))
    # without a software cost: alpha + bytes x beta per step; nothing to send, one rank: 0
    assert cm.software_ring_time(4, 30, Network(alpha=A, beta=B)) == pytest.approx(6 * (A + 8 * 4 * B))
    assert cm.software_ring_time(4, 0, NET) == 0.0
    assert cm.software_ring_time(1, 30, NET) == 0.0


def test_bucket_commu_charges_software_per_ring_step():
    # P = 4: the three all-reduces (80, 128, 54 elements) have chunks of 20, 32, 14 (at most
    # 128 bytes, 1.3e-6 s on the wire < S); 6 steps each
    want = 6 * (A + S) + 6 * (A + S) + 6 * (A + S)
    assert PowerSGDReducer.bucket_commu(4, BUCKET, NET) == pytest.approx(want)
    # P = 2: chunks 40, 64, 27; 2 steps each
    want2 = 2 * (A + S) + 2 * (A + S) + 2 * (A + S)
    assert PowerSGDReducer.bucket_commu(2, BUCKET, NET) == pytest.approx(want2)


def test_software_replaces_the_wire_time_of_small_steps():
    # every step of BUCKET's all-reduces is shorter on the wire than S: the software cost
    # replaces each step's wire time (3 all-reduces x 2 (P - 1) steps)
    bare = Network(alpha=A, beta=B)
    for P, chunks in ((2, (40, 64, 27)), (8, (10, 16, 7)), (32, (3, 4, 2))):
        extra = PowerSGDReducer.bucket_commu(P, BUCKET, NET) - PowerSGDReducer.bucket_commu(P, BUCKET, bare)
        assert extra == pytest.approx(sum(2 * (P - 1) * (S - c * 4 * B) for c in chunks))


def test_large_uncompressed_all_reduce_hides_software():
    # a 1-D tensor of 200,000 entries is all-reduced as it is: at P = 2, chunks of 100,000
    # (4e-3 s on the wire > S); the 2 x 64 P and 2 x 27 Q entries stay latency-bound
    bucket = [(200_000,), (64, 27)]
    want = 2 * (A + 100_000 * 4 * B) + 2 * (A + S) + 2 * (A + S)
    assert PowerSGDReducer.bucket_commu(2, bucket, NET) == pytest.approx(want)


def test_empty_all_reduce_and_one_rank_cost_nothing():
    # a bucket of one compressed matrix issues no all-reduce of uncompressed tensors: 2 of 3
    assert PowerSGDReducer.bucket_commu(4, [(64, 27)], NET) == pytest.approx(6 * (A + S) + 6 * (A + S))
    assert PowerSGDReducer.bucket_commu(1, BUCKET, NET) == 0.0


def test_predict_commu_over_ddps_buckets_with_software():
    shapes = [(64, 3, 3, 3), (64,)]  # one bucket: the bias (backward order first), then the weight
    want = 6 * (A + S) + 6 * (A + S) + 6 * (A + S)
    assert PowerSGDReducer.predict_commu(4, 1728 + 64, NET, shapes=shapes) == pytest.approx(want)


def test_predict_body_waits_for_the_hook_after_backward():
    # one bucket, ready when backward ends (t_compute): the body is t_compute + the bucket's time
    shapes = [(64, 3, 3, 3), (64,)]
    want = 0.05 + 6 * (A + S) + 6 * (A + S) + 6 * (A + S)
    assert PowerSGDReducer.predict_body(4, 1792, NET, 0.05, shapes=shapes) == pytest.approx(want)


def test_ddp_keeps_bare_alpha():
    # DDP's all-reduce of the same bucket (1808 elements: chunks of 452 at P = 4): no software term
    assert DDPReducer.bucket_commu(4, BUCKET, NET) == pytest.approx(6 * (A + 452 * 4 * B))


def test_a_measured_ring_step_latency_replaces_alpha_in_the_backends_collectives_only():
    """``Network.ring_alpha`` (netbench's ring step) prices every step of the backend's own
    ring collectives (dense and the check's all-reduce, Top-k's all-gather, PowerSGD's small
    all-reduces); the sparse reducers' own point-to-point rounds keep alpha (+ software)."""
    R = 3 * A
    ring = Network(alpha=A, beta=B, software=S, ring_alpha=R)
    assert cm.ring_time(4, 30, ring) == pytest.approx(6 * (R + 8 * 4 * B))
    assert cm.dense_time(4, [30, 4_000], ring) == pytest.approx(6 * (R + 8 * 4 * B) + 6 * (R + 1_000 * 4 * B))
    assert cm.topk_time(4, 10, 1_000, ring) == pytest.approx(3 * (R + 10 * (4 + 4) * B))
    assert cm.software_ring_time(4, 30, ring) == pytest.approx(6 * (R + S))
    assert cm.rd_time(4, 100, ring) == cm.rd_time(4, 100, NET)  # point to point: alpha
    assert ring.msg(100) == NET.msg(100) and ring.ring_msg(100) == pytest.approx(R + 100 * B)
    assert NET.ring_msg(100) == NET.msg(100)  # not measured (older profiles, the paper's): alpha
