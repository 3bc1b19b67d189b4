"""The per-message software cost of this package's sparse rounds (``Network.software``), as
``python -m gtopk.perf.netbench`` measures it on the cluster it calibrates.

The ping-pong's alpha is what a bare ``dist.send``/``dist.recv`` pair costs. A message of
one of the sparse reducers' own rounds (gTop-k's tree and recursive doubling, Ok-Topk's
rounds) costs more: posting the receive, encoding and decoding, the bookkeeping
around the merge, waking the rank. netbench times the reducer of ``software.reducer`` (the
gTop-k tree: the reducer itself with ``align_timing`` on, one reduce per sample, as
``netbench.reduce_spans`` with ``time_reducer``, as netbench times every collective) on a gradient of ``software.m`` entries,
small enough that its wire time and merges are negligible, at the ping-pong's P (2) and at
each P of ``collectives.nodes``. Per sample: what the reduce took beyond the alpha-beta time
of that call, divided by the messages on its critical path (the cost model's count,
``critical_messages``). The profile keeps the median at P = 2 (``software``, clipped at 0)
and the samples. The backend's own collectives (dense all-reduce, DDP, Top-k's all-gather)
are gloo's or NCCL's C++ and do not carry it in the model, except PowerSGD's few-KB
all-reduces, whose ring steps cost alpha + max(software, wire time) there
(``gtopk.reducers.costmodel.software_ring_time``, ``PowerSGDReducer.bucket_commu``).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from gtopk.perf.model import predict_commu
from gtopk.reducers.costmodel import Network

#: a network whose every message costs 1 s and every byte nothing: the model's time on it is
#: the number of messages on the critical path
ROUNDS = Network(alpha=1.0, beta=0.0)


def critical_messages(reducer_cfg: Mapping, P: int, m: int) -> float:
    """Local. Messages on the critical path of one reduce of ``reducer_cfg`` in the cost model."""
    return predict_commu(reducer_cfg, P, m, ROUNDS)


def per_message(t_commu: float, reducer_cfg: Mapping, P: int, m: int, net: Network) -> float:
    """Local. (``t_commu`` - the alpha-beta time of that reduce on ``net``, without any
    software cost) / its critical-path messages: the software cost of one message."""
    bare = dataclasses.replace(net, software=0.0)
    return (t_commu - predict_commu(reducer_cfg, P, m, bare)) / critical_messages(reducer_cfg, P, m)


def summary(spans: Sequence[float], cfg: Mapping, P: int, net: Network) -> dict:
    """Local. ``NetworkProfile``'s software fields from the spans (t_commu, s) of the timed
    reduces of netbench's ``cfg['software']`` at P: ``software`` the median per message (0 if
    negative), ``software_samples`` one per span, ``software_notes`` how."""
    rcfg, m = cfg["software"]["reducer"], cfg["software"]["m"]
    samples = [per_message(t, rcfg, P, m, net) for t in spans]
    med = statistics.median(samples)
    settings = ", ".join(f"{k}={v}" for k, v in rcfg.items() if k != "_target_")
    notes = (
        f"median over {len(spans)} reduces of {rcfg['_target_']} ({settings}) at P = {P}, m = {m}, "
        f"align_timing on, of (t_commu - its alpha-beta time) / {critical_messages(rcfg, P, m):g} "
        f"critical-path messages; t_commu median {statistics.median(spans) * 1e3:.4f} ms"
        + ("; the median was negative: taken as 0" if med < 0 else "")
    )
    return {"software": max(0.0, med), "software_samples": samples, "software_notes": notes}


def at_P(t_commu: float | None, cfg: Mapping, P: int, net: Network) -> float | None:
    """Local. ``per_message`` of a median span of netbench's ``cfg['software']`` reduce at P
    (``collectives.csv``'s ``software_at_P``); None without one."""
    s = cfg["software"]
    return None if t_commu is None else per_message(t_commu, s["reducer"], P, s["m"], net)


def describe(software: float, samples: Sequence[float], notes: str) -> str:
    """One line for people: the median, the quartiles of the samples, how it was measured."""
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [software] * 3
    return (
        f"software cost per sparse message {software * 1e3:.4f} ms (samples' quartiles {q[0] * 1e3:.4f} - "
        f"{q[2] * 1e3:.4f} ms): {notes}"
    )
