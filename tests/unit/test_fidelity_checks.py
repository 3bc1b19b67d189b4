"""The arithmetic of the testbed's fidelity checks (``tests.bench.fidelity``) on
summaries made up here, with the expected ratios worked out by hand. The checks themselves,
measured, are benchmarks (``tests/netns/test_fidelity.py``): timing targets do not belong in
pass/fail tests on a machine that may be busy."""

from __future__ import annotations

import pytest

from tests.bench import fidelity

pytestmark = pytest.mark.unit

GBIT = 1e9
PARAMS = 1_000_000  # one bucket (25 MB holds 6.5 M floats)


def job(model: str, reducer: str, P: int, D: int, **times: float) -> dict:
    base = {"t_iter": 0.1, "t_local": 0.01, "t_rest": 0.012, "t_commu_last_arrival": 0.05}
    base.update(times)
    return {
        "model": model,
        "reducer": reducer,
        "nodes": P,
        "dilation": D,
        "params": PARAMS,
        "bandwidth_bits_per_s": GBIT,
        "mtu": 1500,
        **base,
    }


def by_case(found: list[fidelity.Check]) -> dict[str, fidelity.Check]:
    return {c.case: c for c in found}


def test_wire_formula_counts_the_frames():
    # ring all-reduce of 4 MB at P = 8: 2 x 7/8 x 4e6 bytes x 8 bits / 1e9 = 0.056 s of payload;
    # on the wire 1514 bytes carry 1448 of it, so 0.056 x 1514 / 1448 = 0.058552... s
    s = job("m", "dense", 8, 8)
    assert fidelity.wire_seconds(s, framed=False) == pytest.approx(0.056, rel=1e-9)
    assert fidelity.wire_seconds(s) == pytest.approx(0.056 * 1514 / 1448, rel=1e-9)


def test_each_check_compares_what_the_docs_say():
    jobs = [
        job("m", "gtopk", 1, 8, t_local=0.010),
        job("m", "gtopk", 2, 8, t_local=0.0115, t_iter=0.105),  # +15 %: within 20 %
        job("m", "gtopk", 2, 1, t_iter=0.120),  # plain: 0.105 / 0.120 = 0.875, outside 10 %
        job("m", "gtopk", 8, 8, t_local=0.0125),  # +25 %: outside 20 %
        job("m", "dense", 8, 8, t_commu_last_arrival=0.060),
    ]
    found = by_case(fidelity.checks(jobs))
    plain = found["m gtopk P=2 D=8 vs D=1: t_iter"]
    assert (plain.ratio, plain.ok) == (pytest.approx(0.875), False)
    assert found["m gtopk P=2 D=8 vs P=1: t_local"].ok
    p8 = found["m gtopk P=8 D=8 vs P=1: t_local"]
    assert (p8.ratio, p8.ok, p8.asserted) == (pytest.approx(1.25), False, True)
    assert not found["m gtopk P=8 D=8 vs P=1: t_rest"].asserted  # shown, not checked
    framed = found["m dense P=8 D=8: all-reduce vs framed"]
    assert framed.ratio == pytest.approx(0.060 / (0.056 * 1514 / 1448)) and framed.ok
    assert not found["m dense P=8 D=8: all-reduce vs payload"].asserted
    # dense at P = 8 has no P = 1 job here: no rest check is made up for it
    assert not any(c.case.startswith("m dense P=8 D=8 vs P=1") for c in found.values())
