"""The checks that the dilated emulated cluster is faithful (``tests.bench.fidelity``,
docs/cluster.md), measured: Fig. 6's jobs (1 Gbit/s, the paper's compute replayed) for
VGG-16 and ResNet-20 with gTop-k and dense, at P = 1, 2 and 8, every one dilated by D = 8,
and at P = 2 also plain. Five to eight minutes on two cores. Medians over every rank's
timed steps (the summaries').

These are timing targets, so they are benchmarks (``bench``: ``pytest -m bench
tests/netns/test_fidelity.py``; ``make fidelity`` prints the same table), not part of
``make test-slow``: CI's machine may be busy, and a busy machine delays the P = 1 reference or the plain cluster by
more than the tolerances (CI at fedddf3: ``t_local`` of gTop-k at P = 2 came out 0.68-0.79 of
P = 1's, that of dense at P = 8 1.23-1.26 of it). What CI checks of this module is the
arithmetic of the checks (``tests/unit/test_fidelity_checks.py``).

What is asserted, and what is not:

* plain vs dilated at P = 2, t_iter within 10 %: the plain cluster measures the machine
  as it is, so on a machine busy with other work this fails (its CPU work waits for the
  cores): the failure then says so, with the numbers.
* the step's local work (``t_local``: data, selection and residual, the update) at P = 2
  and 8 within 20 % of P = 1. ``t_rest`` also holds the non-finite check, whose flag
  all-reduce is a collective of P ranks (it waits for the slowest rank and pays 2(P - 1)
  message latencies, about 1.5 ms at P = 8 here, dilated or not, more than half of
  ResNet-20's local work): it is printed, not asserted (docs/cluster.md has the numbers).
* dense's all-reduce within 10 % of the wire formula at P = 2 and 8, the formula counting
  the frames the link carries (TCP/IP/Ethernet headers: +4.6 % at MTU 1500); the ratio
  to the payload alone is printed beside it.
"""

from __future__ import annotations

import pytest

from gtopk.run.cluster import cpucap, netns
from tests.bench import fidelity

REASON = netns.unavailable_reason() or cpucap.unavailable_reason(netns.PREFIX)
pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(REASON is not None, reason=f"dilated emulated cluster unavailable: {REASON}"),
]


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> list[fidelity.Check]:
    jobs = fidelity.measure(tmp_path_factory.mktemp("fidelity"), ["vgg16", "resnet20"], [2, 8], dilation=8)
    assert len(jobs) == 16  # 2 models x 2 reducers x (P = 1, 2, 8 dilated + P = 2 plain)
    checks = fidelity.checks(jobs)
    print(fidelity.table(checks))
    return checks


def _failing(found: list[fidelity.Check], kind: str) -> list[fidelity.Check]:
    chosen = [c for c in found if c.check == kind and c.asserted]
    assert chosen, f"no {kind} check was made"
    return [c for c in chosen if not c.ok]


def test_dilated_and_plain_agree_at_p2(found):
    bad = _failing(found, "plain")
    assert not bad, fidelity.table(bad)


def test_local_work_at_p8_is_that_of_p1(found):
    bad = _failing(found, "rest")
    assert not bad, fidelity.table(bad)


def test_dense_allreduce_is_the_wire_formula(found):
    """On the frames the link carries (the payload-only ratios are printed beside them)."""
    bad = _failing(found, "wire")
    assert not bad, fidelity.table(bad)
