"""Every ``cluster=emulated`` value that reaches ``ip``/``tc`` (run as root, batch input) is
parsed into a number with a unit or refused: a bad one raises ClusterError with one line
naming the setting (``cluster.burst=...``) and examples of good ones, before any command
exists; good ones give the very command text the code wrote before values were parsed
(hard-coded below, as read from that code). No root needed: nothing is run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from gtopk.run.cluster import ClusterError, EmulatedCluster, netns
from gtopk.run.cluster.emulated import rate_bits_per_s

ROOT = Path(__file__).resolve().parents[2]
JOB = "gtk1x0a"  # a job name as ``EmulatedCluster.up`` makes them

#: the defaults' ``_commands(JOB, 2)``, as the code before the parsing wrote them
HEAD_DEFAULTS = {
    None: (
        [
            "netns add gtk1x0a-sw",
            "netns add gtk1x0a-r0",
            "netns add gtk1x0a-r1",
            "link add eth0 netns gtk1x0a-r0 mtu 1500 type veth peer name p0 netns gtk1x0a-sw mtu 1500",
            "link add eth0 netns gtk1x0a-r1 mtu 1500 type veth peer name p1 netns gtk1x0a-sw mtu 1500",
        ],
        [],
    ),
    "gtk1x0a-sw": (
        [
            "link add br0 type bridge",
            "link set br0 up",
            "link set p0 master br0",
            "link set p0 up",
            "link set p1 master br0",
            "link set p1 up",
            "link set p0 gso_max_size 16384",
            "link set p1 gso_max_size 16384",
        ],
        [
            "qdisc add dev p0 root tbf rate 1gbit burst 32kb latency 10ms",
            "qdisc add dev p1 root tbf rate 1gbit burst 32kb latency 10ms",
        ],
    ),
    "gtk1x0a-r0": (
        ["link set lo up", "addr add 10.99.0.1/16 dev eth0", "link set eth0 up gso_max_size 16384"],
        ["qdisc add dev eth0 root tbf rate 1gbit burst 32kb latency 10ms"],
    ),
    "gtk1x0a-r1": (
        ["link set lo up", "addr add 10.99.0.2/16 dev eth0", "link set eth0 up gso_max_size 16384"],
        ["qdisc add dev eth0 root tbf rate 1gbit burst 32kb latency 10ms"],
    ),
}

BAD = {
    "bandwidth": [
        "1gbit\nnetns add evil",
        "1gbit; reboot",
        "1 gbit",
        " 1gbit",
        "-1gbit",
        "0gbit",
        "nan",
        "inf",
        "nangbit",
        "1e9bit",
        "",
        "fast",
        "1gb",
        "1ms",
        "1000000000",
        1_000_000_000,
        "1bit",
        math.nan,
        math.inf,
        True,
        None,
        [1],
    ],
    "burst": [
        "32kb\nnetns add evil",
        "32kb;id",
        "32 kb",
        "-32kb",
        "0",
        "nan",
        "inf",
        "",
        "32kbps",
        "10ms",
        "0.5b",
        -32768,
        math.nan,
        math.inf,
        "1e5",
        "99gb",
        False,
        "1kb",  # below one 1500-byte frame: tbf would drop every full-size packet
    ],
    "latency": [
        "10ms\nqdisc del dev eth0 root",
        "10ms && id",
        "10 ms",
        "-10ms",
        "0ms",
        "nan",
        "infms",
        "",
        "10",
        10,
        0.01,
        "10kb",
        "0.5us",
        math.nan,
        math.inf,
        "5000s",
    ],
    "mtu": ["1500\nnetns add evil", "1500;id", " 1500", -1500, 0, 67, 65536, "nan", "", 1500.5, math.nan, True, "1.5k"],
    "gso_max_size": ["16384\nnetns add evil", "16384 up", "-1", -1, "", "nan", math.inf, 16384.0, "16kb", 2**32, True],
}


def _cases():
    return [pytest.param(name, value, id=f"{name}={value!r}") for name, values in BAD.items() for value in values]


@pytest.mark.parametrize("name, value", _cases())
def test_a_bad_value_is_refused_in_one_line_naming_the_setting(name, value):
    with pytest.raises(ClusterError) as e:
        EmulatedCluster(**{name: value})
    message = str(e.value)
    assert "\n" not in message and "\r" not in message
    assert message.startswith(f"cluster.{name}=")
    assert "e.g." in message  # the fix: what a good value looks like


@pytest.mark.parametrize("name, value", _cases())
def test_through_hydra_the_cause_is_that_one_line(name, value):
    """``instantiate(cfg.cluster)`` (as ``gtopk.run.checks.build`` does) wraps it in Hydra's
    multi-line InstantiationException; its cause is the constructor's one-line ClusterError,
    which names ``cluster.<name>`` (what ``checks.build`` keeps as the ConfigError's text)."""
    cfg = OmegaConf.create({"_target_": "gtopk.run.cluster.EmulatedCluster", name: value})
    with pytest.raises(InstantiationException) as e:
        instantiate(cfg)
    cause = e.value.__cause__
    assert isinstance(cause, ClusterError) and "\n" not in str(cause) and str(cause).startswith(f"cluster.{name}=")


def test_the_defaults_give_the_commands_they_gave_before():
    assert EmulatedCluster()._commands(JOB, 2) == HEAD_DEFAULTS
    from_yaml = instantiate(OmegaConf.load(ROOT / "conf" / "cluster" / "emulated.yaml"))
    assert from_yaml._commands(JOB, 2) == HEAD_DEFAULTS


def _shape(cluster: EmulatedCluster) -> str:
    return cluster._commands(JOB, 1)["gtk1x0a-r0"][1][0]


@pytest.mark.parametrize(
    "settings, qdisc",
    [
        ({"bandwidth": "1gbit"}, "qdisc add dev eth0 root tbf rate 1gbit burst 32kb latency 10ms"),
        ({"bandwidth": "100mbit"}, "qdisc add dev eth0 root tbf rate 100mbit burst 32kb latency 10ms"),
        ({"bandwidth": "10gbit"}, "qdisc add dev eth0 root tbf rate 10gbit burst 32kb latency 10ms"),
        ({"bandwidth": "200mbit"}, "qdisc add dev eth0 root tbf rate 200mbit burst 32kb latency 10ms"),
        ({"bandwidth": "100mbit", "burst": "16kb"}, "qdisc add dev eth0 root tbf rate 100mbit burst 16kb latency 10ms"),
        (
            {"bandwidth": "10gbit", "burst": "64kb", "latency": "5ms"},
            "qdisc add dev eth0 root tbf rate 10gbit burst 64kb latency 5ms",
        ),
        # the same numbers in other spellings: written in tc's units
        ({"bandwidth": "1000mbit", "burst": 32768}, "qdisc add dev eth0 root tbf rate 1gbit burst 32kb latency 10ms"),
        (
            {"bandwidth": "125mbps", "latency": "0.01s"},
            "qdisc add dev eth0 root tbf rate 1gbit burst 32kb latency 10ms",
        ),
        (
            {"bandwidth": "1.5GBIT", "latency": "500us"},
            "qdisc add dev eth0 root tbf rate 1500mbit burst 32kb latency 500us",
        ),
        ({"burst": "1600", "latency": "1s"}, "qdisc add dev eth0 root tbf rate 1gbit burst 1600b latency 1s"),
    ],
)
def test_good_values_give_tc_text_from_the_parsed_numbers(settings, qdisc):
    assert _shape(EmulatedCluster(**settings)) == qdisc


def test_mtu_and_gso_max_size_reach_ip_as_numbers():
    c = EmulatedCluster(mtu=9000, gso_max_size=65536)
    root, sw, r0 = (
        c._commands(JOB, 1)[None][0],
        c._commands(JOB, 1)["gtk1x0a-sw"][0],
        c._commands(JOB, 1)[f"{JOB}-r0"][0],
    )
    assert root[-1] == "link add eth0 netns gtk1x0a-r0 mtu 9000 type veth peer name p0 netns gtk1x0a-sw mtu 9000"
    assert sw[-1] == "link set p0 gso_max_size 65536" and r0[-1] == "link set eth0 up gso_max_size 65536"
    assert EmulatedCluster(mtu="1500").mtu == 1500
    for off in (None, 0):  # null (and 0, as before): the kernel's default, no gso command
        c = EmulatedCluster(gso_max_size=off)
        assert c.gso_max_size is None
        assert c._commands(JOB, 1)["gtk1x0a-sw"][0][-1] == "link set p0 up"
        assert c._commands(JOB, 1)[f"{JOB}-r0"][0][-1] == "link set eth0 up"


def test_the_records_keep_the_settings_as_written():
    """``describe`` (what summaries record and analyses compare) is what it was."""
    assert EmulatedCluster().describe() == {
        "cluster": "emulated",
        "bandwidth": "1gbit",
        "bandwidth_bits_per_s": 1e9,
        "burst": "32kb",
        "latency": "10ms",
        "mtu": 1500,
        "gso_max_size": 16384,
    }
    assert EmulatedCluster(bandwidth="100mbit", gso_max_size=None).describe()["gso_max_size"] is None


def test_rates_sizes_and_times_in_tc_units():
    assert rate_bits_per_s("1gbit") == 1e9 and rate_bits_per_s("100mbit") == 1e8 and rate_bits_per_s("125mbps") == 1e9
    assert netns.parse_size("32kb") == 32768 and netns.parse_size("1mb") == 2**20 and netns.parse_size(1500) == 1500
    assert netns.parse_time("10ms") == 10_000 and netns.parse_time("2s") == 2_000_000
    assert netns.tc_rate(10**9) == "1gbit" and netns.tc_rate(10**8) == "100mbit" and netns.tc_rate(1024) == "1024bit"
    assert netns.tc_size(32768) == "32kb" and netns.tc_size(2**20) == "1mb" and netns.tc_size(1514) == "1514b"
    assert netns.tc_time(10_000) == "10ms" and netns.tc_time(1_000_000) == "1s" and netns.tc_time(1500) == "1500us"


def test_only_generated_names_and_one_line_commands_reach_ip():
    c = EmulatedCluster()
    for job, nodes in (("gtk1x0a\nnetns add x", 2), ("../x", 2), (JOB, 0), (JOB, "2"), (JOB, c.MAX_NODES + 1)):
        with pytest.raises(ValueError):
            c._commands(job, nodes)
    for bad in ("link set lo up\nnetns add x", "link set lo up\r", "", "link\x00"):
        with pytest.raises(ValueError, match="one printable line"):
            netns.run_batch("ip", ["link set lo up", bad])
