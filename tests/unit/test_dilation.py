"""Time dilation of the emulated cluster, without root: the virtual clock and its pacing
(``gtopk.host``), the setting and what it makes of the links and CPU caps
(``gtopk.run.cluster.emulated``, ``cpucap``), the launcher's timeouts, and how records say
how a time was obtained (``gtopk.records.summary``). Nothing here runs ``ip``, ``tc`` or
touches a cgroup; tests/netns/test_dilation.py does, as root."""

from __future__ import annotations

import math
import threading
import time

import pytest
from omegaconf import OmegaConf

from gtopk import host
from gtopk.records.summary import summarize, time_base
from gtopk.run.cluster import ClusterError, EmulatedCluster, Placement, cpucap, emulated, netns

JOB = "gtk1x0a"


@pytest.fixture
def dilated(monkeypatch):
    """This process under time dilation D (its clock and sleeps), with fake wall and CPU
    clocks that advance only when told: the pacing is then exact arithmetic."""

    class Fake:
        wall = 100.0
        cpu = 10.0
        slept: list[float] = []
        overrun = 0.0  # what every sleep lasts beyond what it asked for (a wake-up)

    def set_d(d: int) -> type[Fake]:
        monkeypatch.setenv(host.DILATION_ENV, str(d))
        monkeypatch.setattr(host, "_pacing", host._Pacing())
        monkeypatch.setattr(host.time, "perf_counter", lambda: Fake.wall)
        monkeypatch.setattr(host.time, "process_time", lambda: Fake.cpu)
        monkeypatch.setattr(host.torch, "get_num_threads", lambda: 1)

        def sleep(s: float) -> None:
            Fake.slept.append(s)
            Fake.wall += s + Fake.overrun

        monkeypatch.setattr(host.time, "sleep", sleep)
        return Fake

    return set_d


def test_dilation_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(host.DILATION_ENV, raising=False)
    assert host.dilation() == 1
    assert host.dilation({host.DILATION_ENV: "8"}) == 8
    for bad in ("0", "-2", "1.5", "x", "", "²"):
        with pytest.raises(ValueError, match=host.DILATION_ENV):
            host.dilation({host.DILATION_ENV: bad})
    assert Placement("10.99.0.1", 29500, env={host.DILATION_ENV: "4"}).dilation == 4
    assert Placement("127.0.0.1", 0).dilation == 1


def test_virtual_clock_and_sleep(dilated):
    clock = dilated(4)
    assert host.now() == pytest.approx(100.0 / 4)
    clock.wall += 8.0  # 8 wall seconds waiting (no CPU): 2 virtual seconds, no pacing
    assert host.now() == pytest.approx(108.0 / 4) and clock.slept == []
    host.sleep(0.5)  # virtual seconds
    assert clock.slept == [2.0]
    host.sleep(-1.0)  # nothing owed
    assert clock.slept == [2.0]


def test_a_reading_paces_cpu_work_to_d_times_its_cpu_time(dilated):
    clock = dilated(4)
    host.now()
    clock.wall += 1.0
    clock.cpu += 1.0  # one CPU second at full speed: on a processor 4x slower it takes 4 s
    assert host.now() == pytest.approx((100.0 + 4.0) / 4)
    assert clock.slept == [pytest.approx(3.0)]
    clock.wall += 5.0
    clock.cpu += 1.0  # throttled by the cap or waiting: already slower than 4x its CPU
    host.now()
    assert clock.slept == [pytest.approx(3.0)]
    clock.wall += 2.0
    clock.cpu += 1.0  # half-way: paced to 4 s
    host.now()
    assert clock.slept[-1] == pytest.approx(2.0)


def test_close_readings_do_not_add_a_sleeps_overrun_each(dilated):
    """A traced round reads the clock every few microseconds, and every pacing sleep
    overruns (30 us here): the overruns are credited and the small debts carried, so the
    virtual time of a run of readings stays within one overrun / D of D x its CPU time,
    and most readings do not sleep at all."""
    d, us = 2, 1e-6
    clock = dilated(d)
    clock.overrun = 30 * us
    start = host.now()
    cpu = 0.0
    for burst in [5] * 10 + [100] + [5] * 10 + [300]:  # microseconds of CPU at full speed
        clock.wall += burst * us
        clock.cpu += burst * us
        cpu += burst * us
        host.now()
    clock.wall += 5 * us  # one more without CPU: the balance ends and the reading is exact
    end = host.now()
    assert end - start == pytest.approx(cpu + 5 * us / d, abs=30 * us / d)
    assert len(clock.slept) <= 6  # not one per reading


def test_a_wait_ends_the_balance(dilated):
    clock = dilated(2)
    clock.overrun = 30e-6
    host.now()
    clock.wall += 100e-6
    clock.cpu += 100e-6
    host.now()  # slept, overran: a credit
    assert host._pacing.credit > 0
    clock.wall += 1e-3  # waited for a message: nothing owed, the credit is gone
    host.now()
    assert host._pacing.credit == 0.0


def test_every_thread_of_the_rank_is_paced(monkeypatch):
    """The rank's CPU cap holds all its threads, so the pacing counts the process's CPU:
    work on another thread (gloo's network loop, which reads a message and wakes the waiting
    thread) is owed at the next reading, on whichever thread reads the clock."""
    monkeypatch.setenv(host.DILATION_ENV, "4")
    monkeypatch.setattr(host, "_pacing", host._Pacing())
    monkeypatch.setattr(host.torch, "get_num_threads", lambda: 1)
    asked: list[float] = []
    monkeypatch.setattr(host.time, "sleep", asked.append)
    wall = [100.0]  # the wall clock moves only when told; the CPU clock is the real one
    monkeypatch.setattr(host.time, "perf_counter", lambda: wall[0])

    def burn() -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.02:
            pass

    host.now()
    worker = threading.Thread(target=burn)
    worker.start()
    worker.join()
    wall[0] += 0.001
    host.now()
    assert len(asked) == 1 and asked[0] >= 4 * 0.02 - 0.001  # D x the other thread's CPU, less the wall


def test_real_time_is_untouched(dilated):
    clock = dilated(1)
    host.now()
    clock.wall += 1.0
    clock.cpu += 1.0
    assert host.now() == pytest.approx(101.0) and clock.slept == []
    host.sleep(0.25)
    assert clock.slept == [0.25]


@pytest.mark.parametrize("value", ["auto", 1, 8, "8", 200])
def test_dilation_setting_accepted(value):
    assert EmulatedCluster(dilation=value).dilation == ("auto" if value == "auto" else int(value))


@pytest.mark.parametrize("value", [0, -1, 1.5, "fast", True, "", 201, 10**30, "4 ", None])
def test_bad_dilation_is_one_line_naming_the_setting(value):
    with pytest.raises(ClusterError) as e:
        EmulatedCluster(dilation=value)
    text = str(e.value)
    assert text.startswith("cluster.dilation=") and "\n" not in text and "cluster.dilation=auto" in text


def test_auto_is_the_least_d_that_gives_every_thread_a_core(monkeypatch):
    monkeypatch.setattr(emulated, "cores", lambda: 2)
    c = EmulatedCluster()
    assert [c.dilation_for(P, 1) for P in (1, 2, 3, 4, 8, 16, 32)] == [1, 1, 2, 2, 4, 8, 16]
    assert c.dilation_for(2, 2) == 2 and c.dilation_for(1, 2) == 1 and c.dilation_for(3, 2) == 3
    assert c.dilation_for(8) == 4  # the launcher's default threads: cores / nodes, at least 1
    assert EmulatedCluster(dilation=1).dilation_for(32, 4) == 1
    assert EmulatedCluster(dilation=6).dilation_for(2, 1) == 6


def test_the_floor_keeps_cpu_jobs_out_of_real_time_and_leaves_gpus_alone(monkeypatch):
    """``min_dilation`` (``conf/cluster/emulated.yaml``: 2): ``auto`` gives CPU ranks at
    least that D, where it would have given real time; a GPU's ranks (never dilated) and a
    fixed ``dilation`` are left as they are."""
    monkeypatch.setattr(emulated, "cores", lambda: 2)
    c = EmulatedCluster(min_dilation=2)
    assert [c.dilation_for(P, 1) for P in (1, 2, 3, 4, 8)] == [2, 2, 2, 2, 4]
    assert [c.dilation_for(P, 1, "cuda:0") for P in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert EmulatedCluster(min_dilation=4).dilation_for(2, 1, "cpu") == 4
    assert EmulatedCluster(dilation=1, min_dilation=4).dilation_for(2, 1) == 1
    assert EmulatedCluster(dilation=6, min_dilation=8).dilation_for(1, 1) == 6


def test_the_floor_reaches_the_check_and_the_gpu_rule(monkeypatch):
    """A P = 1 CPU job under the floor is dilated, so it needs CPU caps (refused in one line
    without them); the same job on a GPU is not dilated, so it is not refused."""
    _checkable(monkeypatch, "no cgroup CPU controller")
    with pytest.raises(ClusterError, match=r"^cluster.dilation=auto \(D = 2 for nodes=1\)"):
        EmulatedCluster(min_dilation=2).check(1, 1)
    EmulatedCluster(min_dilation=2).check(1, 1, "cuda")  # D = 1 on the GPU: no caps needed
    cfg = OmegaConf.create(
        {
            "nodes": 1,
            "threads_per_worker": None,
            "backend": "auto",
            "device": "cuda",
            "compute": {"_target_": "gtopk.train.compute.MeasuredCompute"},
        }
    )
    from gtopk.run import checks

    monkeypatch.setattr(checks, "placement", lambda device, backend, wants_gpu: ("cuda", "nccl"))
    EmulatedCluster(min_dilation=2).check_job(cfg)  # not refused: a GPU's ranks get no floor


@pytest.mark.parametrize("value", [0, -1, "two", 201])
def test_bad_min_dilation_is_one_line_naming_the_setting(value):
    with pytest.raises(ClusterError) as e:
        EmulatedCluster(min_dilation=value)
    text = str(e.value)
    assert text.startswith("cluster.min_dilation=") and "\n" not in text and "cluster.min_dilation=2" in text


def test_links_run_at_the_rate_over_d_with_the_same_bytes_queued():
    c = EmulatedCluster(bandwidth="1gbit", burst="32kb", latency="10ms")
    assert c.shaping(1) == (10**9, 32768, 10_000)
    assert c.shaping(4) == (250 * 10**6, 32768, 40_000)
    rate, _, _ = c.shaping(3)  # 125e6 bytes/s / 3 is not whole: rounded to whole bytes/s
    assert rate % 8 == 0 and rate == pytest.approx(1e9 / 3, rel=1e-7)
    tc = c._commands(JOB, 2, 4)
    assert tc[f"{JOB}-sw"][1] == [f"qdisc add dev p{r} root tbf rate 250mbit burst 32kb latency 40ms" for r in range(2)]
    assert tc[f"{JOB}-r1"][1] == ["qdisc add dev eth0 root tbf rate 250mbit burst 32kb latency 40ms"]
    assert c._commands(JOB, 2) == c._commands(JOB, 2, 1)  # real time: the commands of before
    with pytest.raises(ValueError, match="time dilation"):
        c._commands(JOB, 2, 0)


def test_cpu_cap_is_threads_over_d_cores():
    assert cpucap.quota(1, 8) == (5000, 40000)
    assert cpucap.quota(2, 4) == (10000, 20000)
    assert cpucap.quota(1, emulated.MAX_DILATION)[1] == cpucap.MAX_PERIOD_US
    with pytest.raises(ValueError, match="1 s"):
        cpucap.quota(1, emulated.MAX_DILATION + 1)
    with pytest.raises(ValueError):
        cpucap.quota(0, 2)


def _checkable(monkeypatch, cap_reason: str | None = None) -> None:
    """``check`` as on a machine where namespaces can be built (and CPU caps, unless ``cap_reason``)."""
    monkeypatch.setattr(netns, "unavailable_reason", lambda: None)
    monkeypatch.setattr(cpucap, "unavailable_reason", lambda prefix: cap_reason)
    monkeypatch.setattr(emulated, "cores", lambda: 2)


def test_dilation_without_cpu_caps_is_refused_in_one_line(monkeypatch):
    _checkable(monkeypatch, "no cgroup CPU controller")
    EmulatedCluster().check(2, 1)  # D = 1: no caps needed
    with pytest.raises(ClusterError, match=r"^cluster.dilation=auto \(D = 4 for nodes=8\).*cluster.dilation=1"):
        EmulatedCluster().check(8, 1)
    _checkable(monkeypatch)
    with pytest.raises(ClusterError, match="need D = 400, above 200"):
        EmulatedCluster().check(800, 1)


def test_a_dilated_job_on_a_gpu_is_refused(monkeypatch):
    _checkable(monkeypatch)
    base = {"nodes": 8, "threads_per_worker": None, "backend": "auto", "compute_name": "measured"}
    cfg = OmegaConf.create({**base, "device": "cuda", "compute": {"_target_": "gtopk.train.compute.MeasuredCompute"}})
    from gtopk.run import checks

    monkeypatch.setattr(checks, "placement", lambda device, backend, wants_gpu: ("cuda", "nccl"))
    with pytest.raises(ClusterError, match=r"with device=cuda.*device=cpu, compute=replay or cluster.dilation=1"):
        EmulatedCluster().check_job(cfg)
    EmulatedCluster(dilation=1).check_job(cfg)  # real time: a GPU is fine
    monkeypatch.setattr(checks, "placement", lambda device, backend, wants_gpu: ("cpu", "gloo"))
    EmulatedCluster().check_job(cfg)


def test_records_say_how_their_times_were_obtained():
    row = {"t_data": 0.0, "t_compute": 0.1, "t_compr": 0.01, "t_commu": 0.02, "t_update": 0.005, "t_iter": 0.14}
    row |= {"bytes_sent": 1, "bytes_recv": 1, "iter": 0, "t_check": 0.005}
    assert time_base([dict(row, dilation=4)] * 2) == {"time_base": "dilated", "dilation": 4}
    assert time_base([row]) == {"time_base": "real", "dilation": 1}  # older rows: real time
    assert time_base([dict(row, dilation=1), dict(row, dilation=2)]) == {"time_base": "mixed", "dilation": [1, 2]}
    s = summarize([dict(row, dilation=4)], {"params": 10, "mode": "benchmark"}, 32)
    assert s["time_base"] == "dilated" and s["dilation"] == 4
    assert s["t_rest"] == pytest.approx(0.14 - 0.1 - 0.02) and s["t_local"] == pytest.approx(0.015)
    assert math.isclose(s["t_rest"] - s["t_local"], row["t_check"])
