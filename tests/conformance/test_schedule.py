"""Every ``conf/reducer`` config's schedule as it runs (``gtopk.perf.schedulecheck``: the
reducer's own code as every rank of P in one process, its ``torch.distributed`` calls
recorded) against its own cost model (``predict_commu``), its records and its reference.
``make test``: P = 3 and 8; slow: P = 2, 5, 16, 33, 128 and 1,024."""

from __future__ import annotations

import pytest

from gtopk.perf import schedulecheck as sc

pytestmark = pytest.mark.conformance
SLOW = (2, 5, 16, 33, 128, 1024)


@pytest.mark.parametrize("P", [3, 8, *(pytest.param(P, marks=pytest.mark.slow) for P in SLOW)])
def test_recorded_calls_match_the_cost_model(name, P):
    c = sc.case(name)
    if c.skip:
        pytest.skip(c.skip)
    assert sc.check(sc.record(c, P), reference_upto=128) == []
