"""The kit's one parameter: ``name``, every ``conf/reducer/*.yaml`` and every test-only example
of ``tests/conformance/examples/reducer/*.yaml`` (discovered)."""

from __future__ import annotations

import pytest

from gtopk.perf import schedulecheck
from tests.conformance import kit

#: checks that start ``run.py reducer=<name>``, which composes ``conf/reducer`` only
RUN_PY = ("test_resume",)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "name" in metafunc.fixturenames:
        examples = set(kit.names(kit.EXAMPLES))
        skip = pytest.mark.skip(reason="a test-only example (tests/conformance/examples): run.py does not offer it")
        runs_run_py = metafunc.module.__name__.rsplit(".", 1)[-1] in RUN_PY
        metafunc.parametrize(
            "name", [pytest.param(n, marks=skip) if n in examples and runs_run_py else n for n in kit.names()]
        )


@pytest.fixture(autouse=True)
def examples_in_the_schedule_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``schedulecheck.case(name)`` reads ``conf/reducer``: for an example, its own yaml."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("name") in kit.names(kit.EXAMPLES):
        monkeypatch.setattr(schedulecheck, "case", kit.schedule_case)


@pytest.fixture
def reducer_node(name: str) -> dict:
    """The resolved reducer node of ``run.py reducer=<name>`` (the real config)."""
    return kit.node(name)
