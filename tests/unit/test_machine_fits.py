"""The pre-start memory check (``gtopk.run.checks.machine_fits``) counts the imports once
when the workers are forked from the fork server (they share those pages) and once per
worker when they are spawned: 32 VGG-16 ranks fit a 23.5 GiB machine only the first way
(measured: 370 MiB private per forked rank, 714 spawned; docs/cluster.md)."""

from __future__ import annotations

import pytest

from gtopk.run import checks, forkserver
from gtopk.run.checks import ConfigError, machine_fits

MACHINE = int(23.5 * 2**30)


@pytest.fixture
def this_machine(monkeypatch):
    monkeypatch.setattr(checks, "memory_total", lambda: MACHINE)


def test_32_forked_vgg16_ranks_pass(compose, this_machine, monkeypatch):
    monkeypatch.setattr(forkserver, "expected_method", lambda: "forkserver")
    machine_fits(compose(["experiment=fig6_reproduce", "model=vgg16", "nodes=32"]), "cpu")


def test_32_spawned_vgg16_ranks_are_refused_naming_the_setting(compose, this_machine, monkeypatch):
    monkeypatch.setattr(forkserver, "expected_method", lambda: "spawn")
    cfg = compose(["experiment=fig6_reproduce", "model=vgg16", "nodes=32"])
    with pytest.raises(ConfigError, match=r"nodes=32 workers need at least .* use fewer nodes"):
        machine_fits(cfg, "cpu")


def test_forked_ranks_still_pay_for_their_model(compose, this_machine, monkeypatch):
    """AlexNet's 61 M parameters at BYTES_PER_PARAM each: 64 forked ranks do not fit."""
    monkeypatch.setattr(forkserver, "expected_method", lambda: "forkserver")
    with pytest.raises(ConfigError, match=r"MiB shared by the workers of the fork server"):
        machine_fits(compose(["experiment=fig6_reproduce", "model=alexnet", "nodes=64"]), "cpu")


def test_the_expected_method_follows_the_environment(monkeypatch):
    monkeypatch.setenv(forkserver.METHOD_ENV, "spawn")
    assert forkserver.expected_method() == "spawn"
    monkeypatch.delenv(forkserver.METHOD_ENV)
    assert forkserver.expected_method() == "forkserver"  # Linux has one
