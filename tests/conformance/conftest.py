"""The kit's one parameter: ``name``, every ``conf/reducer/*.yaml`` (discovered)."""

from __future__ import annotations

import pytest

from tests.conformance import kit


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "name" in metafunc.fixturenames:
        metafunc.parametrize("name", kit.names())


@pytest.fixture
def reducer_node(name: str) -> dict:
    """The resolved reducer node of ``run.py reducer=<name>`` (the real config)."""
    return kit.node(name)
