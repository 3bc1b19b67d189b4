"""The calibration's ping-pong times a small message (alpha's) at least ``SMALL_REPS`` times
and a large one ``reps`` times, with two untimed round trips first, and reports the median
one-way time: a fake process group that answers every receive counts the round trips."""

from __future__ import annotations

import itertools

from gtopk.perf import latency as netbench  # netbench's ping-pong lives there


class FakeDist:
    """Rank 0's side of a two-rank world: every send/recv is counted per message size."""

    def __init__(self):
        self.sends: dict[int, int] = {}

    def send(self, buf, dst):
        self.sends[buf.numel()] = self.sends.get(buf.numel(), 0) + 1

    def recv(self, buf, src):
        pass

    def barrier(self):
        pass

    def get_backend(self):
        return "gloo"


def test_small_messages_get_more_round_trips_than_large_ones(monkeypatch):
    fake, ticks = FakeDist(), itertools.count()
    monkeypatch.setattr(netbench, "dist", fake)
    # each reading of the clock is one second later: every round trip reads twice -> 1 s, one way 0.5 s
    monkeypatch.setattr(netbench.host, "now", lambda: float(next(ticks)))
    big = netbench.SMALL_BYTES * 4
    out = netbench.pingpong(0, 2, [8, netbench.SMALL_BYTES, big], reps=3)
    assert fake.sends == {8: netbench.SMALL_REPS + 2, netbench.SMALL_BYTES: netbench.SMALL_REPS + 2, big: 3 + 2}
    assert out == [(8, 0.5), (netbench.SMALL_BYTES, 0.5), (big, 0.5)]
    fake.sends.clear()
    netbench.pingpong(0, 2, [8], reps=netbench.SMALL_REPS * 2)  # more asked for: more given
    assert fake.sends == {8: netbench.SMALL_REPS * 2 + 2}
