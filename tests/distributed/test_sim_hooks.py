"""The simulated hook baselines equal torch's hooks in DDP: 20 steps of a small model
(``sim_hooks_training``) on P = 2 and 4 real processes (DDP, torch's fp16 and PowerSGD
hooks, gloo on loopback) and on P virtual ranks of this process (``reduce_group``), with
the real ranks' intra-op thread count.

Tolerance (per-iteration loss of every rank, and the final weights as the largest absolute
difference over the largest absolute weight):

* P = 2: bit-identical (gloo's sum of two tensors is a + b, the simulation's too).
* P = 4: gloo sums the four ranks' tensors in its own order (a ring, starting at another
  rank for each chunk), the simulation in rank order. PowerSGD in float64: 1e-12
  (measured: losses equal, weights 1e-15); in float32: 1e-5 (measured 2e-7 and 7e-7).
  The fp16 hook adds fp16 numbers, each add rounded to 11 bits, so the order moves a
  gradient entry by up to an fp16 ulp: 1e-3 for the weights and 1e-4 for the losses
  (measured 5e-5 and 3e-6 in float64 and float32 alike).

The tolerances are far below what a dropped error feedback, a dropped warm start or an
undivided sum change (``test_the_tolerance_tells_a_dropped_feature_apart``), and the layout
of every bucket each step is DDP's (one bucket of every parameter in the first step, then
the rebuilt ones).
"""

from __future__ import annotations

import pytest
import torch

from gtopk.run.spawn import spawn
from gtopk.simulated.hooks import VirtualGroup
from tests.distributed.sim_hooks_training import Setting, real_run, simulated_run

SETTINGS = [
    Setting("ddp_fp16"),
    Setting("powersgd"),
    # every Q drawn anew each step (one seed per bucket, tensors in DDP's order), QR (rank 3)
    Setting(
        "powersgd",
        {"warm_start": False, "use_error_feedback": False, "start_powerSGD_iter": 1, "matrix_approximation_rank": 3},
    ),
    Setting("ddp_fp16", dtype="float32"),
    Setting("powersgd", dtype="float32"),
]
#: P = 4: (losses, weights) relative tolerance by (reducer, dtype); P = 2: 0
TOLERANCE = {
    ("ddp_fp16", "float64"): (1e-4, 1e-3),
    ("ddp_fp16", "float32"): (1e-4, 1e-3),
    ("powersgd", "float64"): (1e-12, 1e-12),
    ("powersgd", "float32"): (1e-5, 1e-5),
}


SIZES = (2, 4)


@pytest.fixture(scope="module")
def real() -> list[dict]:
    """Every setting on P = 2 and 4 real processes (one group of 4; P = 2 on ranks 0 and 1)."""
    return spawn(real_run, max(SIZES), (SETTINGS, SIZES), timeout=300)


@pytest.fixture(scope="module", params=SIZES, ids=lambda p: f"P{p}")
def runs(request, real) -> tuple[int, dict, dict]:
    """(P, real runs by setting name as rank lists, simulated runs by setting name)."""
    P = request.param
    threads = torch.get_num_threads()
    torch.set_num_threads(real[0]["threads"])
    try:
        simulated = {s.name: simulated_run(s, P) for s in SETTINGS}
    finally:
        torch.set_num_threads(threads)
    return P, {s.name: [r[P][s.name] for r in real[:P]] for s in SETTINGS}, simulated


def differences(real: list[dict], sim: dict) -> tuple[float, float]:
    """(largest relative loss difference over ranks and steps, weight difference)."""
    a = torch.tensor([r["losses"] for r in real]).T  # [steps, P]
    b = torch.tensor(sim["losses"])
    loss = float(((a - b).abs() / b.abs()).max())
    weight = max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(real[0]["weights"], sim["weights"]))
    return loss, weight


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_simulated_hooks_train_as_torchs(runs, setting):
    P, real, simulated = runs
    mine, theirs = simulated[setting.name], real[setting.name]
    assert all(r["weights"][0].equal(theirs[0]["weights"][0]) for r in theirs)  # DDP kept the ranks alike
    assert mine["layouts"] == theirs[0]["layouts"]  # every step's buckets are DDP's
    assert len(mine["layouts"]) == setting.steps and len(mine["layouts"][0]) == 1
    assert len(mine["layouts"][1]) == (4 if setting.dtype == "float64" else 3)
    if P == 2:
        assert torch.tensor(mine["losses"]).equal(torch.tensor([r["losses"] for r in theirs]).T)
        assert all(x.equal(y) for x, y in zip(mine["weights"], theirs[0]["weights"]))
    else:
        loss, weight = differences(theirs, mine)
        tol_loss, tol_weight = TOLERANCE[setting.reducer, setting.dtype]
        assert loss <= tol_loss and weight <= tol_weight, (loss, weight)


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.dtype == "float32"], ids=lambda s: s.name)
def test_simulated_records_say_what_the_hooks_sent(runs, setting):
    """payload_bytes, traffic and selected of every rank and step, as the real reducer
    reports them (PowerSGD: fp32 buckets for two steps, then its Ps, Qs and small tensors)."""
    P, real, simulated = runs
    for rank in range(P):
        assert [recs[rank] for recs in simulated[setting.name]["records"]] == real[setting.name][rank]["records"]
    sent = [recs[0]["payload_bytes"] for recs in simulated[setting.name]["records"]]
    m = sum(w.numel() for w in simulated[setting.name]["weights"])
    if setting.reducer == "powersgd":
        assert sent[:2] == [4 * m] * 2 and all(0 < s < m for s in sent[2:]), sent
    else:
        assert sent == [2 * m] * setting.steps


class Undivided(VirtualGroup):
    """A group that says it has one rank: the hooks would sum instead of averaging."""

    def size(self) -> int:
        return 1


def undivided(setting: Setting, P: int) -> dict:
    run = simulated_run(setting, P, steps=0)
    for rank, w in enumerate(run["workers"]):
        group = Undivided(rank, w.simulation.allreduce)
        if setting.reducer == "powersgd":
            w.comm_state.process_group = group
        else:
            w.comm_state = group
    return simulated_run(setting, P, workers=run["workers"], net=run["net"])


@pytest.mark.parametrize(
    "setting,broken",
    [
        (Setting("powersgd"), lambda s, P: simulated_run(Setting("powersgd", {"use_error_feedback": False}), P)),
        (Setting("powersgd"), lambda s, P: simulated_run(Setting("powersgd", {"warm_start": False}), P)),
        (Setting("powersgd"), undivided),
        (Setting("ddp_fp16"), undivided),
    ],
    ids=["no-error-feedback", "no-warm-start", "powersgd-undivided", "fp16-undivided"],
)
def test_the_tolerance_tells_a_dropped_feature_apart(runs, setting, broken):
    """Against torch's hooks with the feature, the simulation without it is off by far
    more than the tolerance (each by at least 100x in the weights)."""
    P, real, _ = runs
    loss, weight = differences(real[setting.name], broken(setting, P))
    assert weight > 100 * TOLERANCE[setting.reducer, setting.dtype][1], (loss, weight)
