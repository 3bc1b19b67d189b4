"""The per-message software cost of the sparse rounds (``Network.software``): carried by the
sparse reducers' messages only, stored in and loaded from profiles (0 for old ones), and
netbench's arithmetic (``gtopk.perf.software``); hand-computed numbers throughout."""

from __future__ import annotations

import json

import pytest

from analysis.payoff import validate
from analysis.payoff.itertime import networks
from gtopk.perf import software
from gtopk.perf.model import predict_commu
from gtopk.perf.netprofile import NetworkProfile

GTOPK = {"_target_": "gtopk.reducers.GTopKReducer", "density": 0.001, "algorithm": "tree"}
EXACT = GTOPK | {"putback": "exact"}
RD = GTOPK | {"algorithm": "recursive_doubling"}
TOPK = {"_target_": "gtopk.reducers.TopKReducer", "density": 0.001}
OKTOPK = {"_target_": "gtopk.reducers.oktopk.OkTopKReducer", "density": 0.001}
DENSE = {"_target_": "gtopk.reducers.DenseReducer", "bucket_mb": 25.0}
DDP = {"_target_": "baselines.ddp.DDPReducer", "bucket_mb": 25.0}
M = 10_000  # k = 10: a gTop-k message is 10 x 8 = 80 bytes; dense's ring chunk at P = 8 is 1,250 x 4 = 5,000
ALPHA, BETA, S = 1e-3, 1e-6, 0.5e-3


def net(s: float = S):
    return NetworkProfile(alpha=ALPHA, beta=BETA, software=s).network


def test_gtopk_tree_at_8_gets_s_per_critical_path_message_and_dense_nothing():
    # tree, P = 8: 3 rounds up and 3 down, 80 bytes each: 6 (alpha + s) + 480 beta
    assert predict_commu(GTOPK, 8, M, net()) == pytest.approx(6 * 1.5e-3 + 480e-6)
    assert predict_commu(GTOPK, 8, M, net(0.0)) == pytest.approx(6 * 1e-3 + 480e-6)
    # dense ring, P = 8: 14 messages of 5,000 bytes, alpha only: 14 x (1e-3 + 5e-3)
    assert predict_commu(DENSE, 8, M, net()) == pytest.approx(0.084)
    # DDP: the same ring on its one bucket of 10,000 entries
    assert predict_commu(DDP, 8, M, net(), shapes=[(100, 100)]) == pytest.approx(0.084)


@pytest.mark.parametrize(
    "cfg, P, messages, carried",
    [
        (GTOPK, 2, 2, 2),  # one up, one down
        (GTOPK, 8, 6, 6),
        (RD, 8, 3, 3),  # three exchanges
        (EXACT, 8, 9, 9),  # the tree's 6, then the values' recursive doubling: 3
        (TOPK, 8, 7, 0),  # ring all-gather, P - 1 messages: gloo's own (C++), like dense: none carried
        (OKTOPK, 4, 12 + 6 / 64, 12 + 6 / 64),  # 4 (P - 1) per step; the boundaries' 2 (P - 1) every 64 steps
    ],
)
def test_each_of_our_sparse_rounds_messages_carries_it_and_gloos_collectives_none(cfg, P, messages, carried):
    on_software_alone = NetworkProfile(alpha=0.0, beta=0.0, software=1e-3).network
    assert predict_commu(cfg, P, M, on_software_alone) == pytest.approx(carried * 1e-3)
    assert software.critical_messages(cfg, P, M) == pytest.approx(messages)


def test_old_profile_loads_with_zero_and_says_so(tmp_path, capsys):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"alpha": ALPHA, "beta": BETA, "name": "old"}))
    prof = NetworkProfile.load(path)
    assert prof.software == 0.0 and prof.network.software == 0.0
    assert "taken as 0" in prof.software_notes and "taken as 0" in capsys.readouterr().err


def test_profile_keeps_software_and_its_samples(tmp_path):
    path = tmp_path / "profile.json"
    NetworkProfile(alpha=ALPHA, beta=BETA, software=S, software_samples=[4e-4, 6e-4], software_notes="how").save(path)
    prof = NetworkProfile.load(path)
    assert (prof.software, prof.software_samples, prof.software_notes) == (S, [4e-4, 6e-4], "how")
    assert prof.network.software == S


def test_netbench_arithmetic_residual_over_messages():
    bare = NetworkProfile(alpha=ALPHA, beta=BETA).network
    # tree at P = 2: 2 messages of 80 bytes, 2 x (1e-3 + 80e-6) = 2.16 ms; 3.16 ms measured
    assert software.per_message(3.16e-3, GTOPK, 2, M, bare) == pytest.approx(0.5e-3)
    # the network's own software cost is not subtracted: the residual is against alpha-beta alone
    assert software.per_message(3.16e-3, GTOPK, 2, M, net()) == pytest.approx(0.5e-3)
    # at P = 8 (6 messages, 6.48 ms modelled), 9.48 ms measured
    assert software.per_message(9.48e-3, GTOPK, 8, M, bare) == pytest.approx(0.5e-3)


def test_netbench_summary_is_the_median_and_never_negative():
    cfg = {"software": {"reducer": GTOPK, "m": M}}
    spans = [2.16e-3 + 2 * 0.4e-3, 3.16e-3, 2.16e-3 + 2 * 0.9e-3]
    out = software.summary(spans, cfg, 2, NetworkProfile(alpha=ALPHA, beta=BETA).network)
    assert out["software"] == pytest.approx(0.5e-3)
    assert out["software_samples"] == pytest.approx([0.4e-3, 0.5e-3, 0.9e-3])
    assert "P = 2" in out["software_notes"] and "/ 2 critical-path messages" in out["software_notes"]
    low = software.summary([2.0e-3, 2.1e-3, 2.16e-3], cfg, 2, NetworkProfile(alpha=ALPHA, beta=BETA).network)
    assert low["software"] == 0.0 and "taken as 0" in low["software_notes"]
    assert software.at_P(None, cfg, 4, net()) is None


def test_payoff_networks_and_validation_carry_it():
    prof = NetworkProfile(alpha=ALPHA, beta=BETA, name="here", cluster={"bandwidth": "1gbit"}, software=S)
    nets = networks([prof], sweep=(10.0,))
    assert [n.software for n in nets] == [S, S]  # the calibrated network and the sweep's point
    assert nets[1].profile.network.software == S
    assert validate.net_of({"bandwidth": "1gbit"}, [prof]).software == S
