"""The kit catches a broken reducer: a yaml dropped into a conf folder joins it, and a
reducer that sends the wrong update but keeps the replicas equal fails the reference
checks (one worker in ``make test``; real processes, slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from gtopk.run.spawn import spawn
from tests.conformance import kit
from tests.conformance import test_single_worker as single

pytestmark = pytest.mark.conformance


@pytest.fixture
def broken(tmp_path: Path) -> dict:
    (tmp_path / "reducer").mkdir()
    (tmp_path / "reducer" / "scaled.yaml").write_text(
        "_target_: tests.conformance.broken.ScaledDense\nbucket_mb: 25.0\n"
    )
    assert kit.names(tmp_path) == ["scaled"]  # a new file is enough to join
    return kit.node_from(tmp_path / "reducer" / "scaled.yaml")


def test_a_wrong_update_fails_the_single_worker_reference_check(broken):
    with pytest.raises(AssertionError, match="step 0"):
        single.test_one_worker_applies_what_its_reference_says(broken)
    r = instantiate(broken)
    assert r.world_size == 1


@pytest.mark.slow
def test_a_wrong_update_fails_on_real_processes_though_replicas_agree(broken):
    out = spawn(kit.real_steps, 2, ({"scaled": broken},), timeout=300)
    assert all(o["scaled"]["failures"] for o in out)
    assert all(o["scaled"]["updates"][0].equal(out[0]["scaled"]["updates"][0]) for o in out)


def test_an_error_in_code_the_reducer_and_its_reference_share_fails_conservation(tmp_path):
    from tests.conformance import test_conservation as conservation

    (tmp_path / "reducer").mkdir()
    (tmp_path / "reducer" / "undivided.yaml").write_text(
        "_target_: tests.conformance.broken.UndividedTopK\ndensity: 0.02\n"
    )
    n = kit.node_from(tmp_path / "reducer" / "undivided.yaml")
    single.test_one_worker_applies_what_its_reference_says(n)  # P = 1: x 1 hides it, and the reference agrees
    with pytest.raises(AssertionError, match="P x updates"):
        conservation.test_what_is_applied_plus_what_is_kept_is_every_gradient(n)
