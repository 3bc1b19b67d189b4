"""``python -m gtopk.perf.tracerun``: where each reducer's collective spends its time, at every P.

For every P of ``nodes``, gradient size of ``m`` and reducer of ``reducers``
(``conf/trace.yaml``), ``steps`` calls are traced on every rank (gTop-k: each message and
merge, ``GTopKReducer.trace``; a backend collective such as Top-k's all-gather: its call,
``gtopk.perf.trace.collective_trace``), the ranks' events gathered on rank 0 and each call's
critical path split into skew, wire, transport and software time (``gtopk.perf.trace``),
beside the alpha-beta bound (the reducer's ``predict_commu``) with alpha and beta calibrated
first by a ping-pong between two ranks of the same cluster (``gtopk.perf.netbench.pingpong``)
or read from ``profile``. Writes ``steps.csv`` (every traced call) and ``trace.csv`` (per
reducer, gradient size and P: the median call's breakdown) under ``out`` and prints the table.

``realtime=true`` (root): the traced calls run under ``SCHED_FIFO``
(``gtopk.host.scheduling``), so that other jobs on the machine do not land in
the trace. Runs on any cluster of ``conf/cluster`` (``cluster=local``: loopback; ``cluster=emulated``:
shaped namespaces; a time-dilated one records virtual seconds through ``gtopk.host.Clock``,
calibration included). Every rank must run on this host: the events are compared on its
one clock.
"""

from __future__ import annotations

import socket
import statistics
import sys
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from gtopk.host import Clock, scheduling
from gtopk.perf import netbench
from gtopk.perf.model import check_reducer, predict_commu
from gtopk.perf.netprofile import NetworkProfile, fit_alpha_beta
from gtopk.perf.trace import call_events, collective_trace, critical_path
from gtopk.reducers import validate_density
from gtopk.reducers.costmodel import Network, topk_time
from gtopk.reducers.selection.exact import k_for
from gtopk.reducers.wire import RoundTrace
from gtopk.run import checks, dispatch
from gtopk.run.dispatch import GroupSpec, run_on_cluster

COLUMNS = ("total", "span", "skew", "wire", "transport", "software", "merge")


def check(cfg: DictConfig) -> None:
    """The settings this tool adds, each refused in one line naming it and the fix."""
    nodes = list(cfg.nodes) if OmegaConf.is_list(cfg.nodes) else None
    if not nodes or any(not isinstance(P, int) or isinstance(P, bool) or P < 2 for P in nodes):
        raise checks.ConfigError(f"nodes={cfg.nodes} must be a list of integers >= 2, e.g. nodes=[2,4,8]")
    sizes = list(cfg.m) if OmegaConf.is_list(cfg.m) else None
    if not sizes or any(not isinstance(m, int) or isinstance(m, bool) or m < 1 for m in sizes):
        raise checks.ConfigError(f"m={cfg.m} must be a list of gradient sizes >= 1, e.g. m=[269722]")
    for key, low in (("warmup", 0), ("steps", 1)):
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < low:
            raise checks.ConfigError(f"{key}={cfg[key]} must be an integer >= {low}, e.g. {key}=10")
    pp = cfg.pingpong
    if (
        not OmegaConf.is_list(pp.sizes)
        or len({n for n in pp.sizes if isinstance(n, int) and n >= 1}) != len(pp.sizes)
        or len(pp.sizes) < 2
    ):
        raise checks.ConfigError(
            f"pingpong.sizes={pp.sizes} must be distinct byte counts >= 1, e.g. as in conf/trace.yaml"
        )
    if not isinstance(pp.reps, int) or isinstance(pp.reps, bool) or pp.reps < 1:
        raise checks.ConfigError(f"pingpong.reps={pp.reps} must be an integer >= 1, e.g. pingpong.reps=10")
    try:
        validate_density(cfg.density)
    except ValueError as e:
        raise checks.ConfigError(str(e)) from None
    if not OmegaConf.is_dict(cfg.reducers) or not cfg.reducers:
        raise checks.ConfigError("reducers= must name at least one reducer config, as in conf/trace.yaml")
    for name, rcfg in cfg.reducers.items():
        try:
            check_reducer(OmegaConf.to_container(rcfg, resolve=True))
        except ValueError as e:
            raise checks.ConfigError(f"reducers.{name}: {e}") from None
    if not isinstance(cfg.realtime, bool) or not isinstance(cfg.align_timing, bool):
        raise checks.ConfigError(
            f"realtime={cfg.realtime}, align_timing={cfg.align_timing}: each must be true or false"
        )
    if cfg.realtime and cfg.cluster.get("dilation", 1) != 1:
        raise checks.ConfigError(
            f"realtime=true would escape the CPU cap of time dilation (cluster.dilation={cfg.cluster.dilation}); "
            "set realtime=false, or cluster.dilation=1"
        )
    if cfg.realtime:
        try:
            scheduling(True)
            scheduling(False)
        except PermissionError:
            raise checks.ConfigError(
                "realtime=true needs root or CAP_SYS_NICE (SCHED_FIFO); set realtime=false"
            ) from None
    if cfg.profile is not None and not Path(cfg.profile).is_file():
        raise checks.ConfigError(f"profile={cfg.profile} is not a file; give netbench's profile.json or profile=null")


def pingpong(rank: int, world: int, sizes: list[int], reps: int, realtime: bool) -> list | None:
    """Collective: ``gtopk.perf.netbench.pingpong``, under ``SCHED_FIFO`` with ``realtime``."""
    if realtime:
        scheduling(True)
    try:
        return netbench.pingpong(rank, world, sizes, reps)
    finally:
        if realtime:
            scheduling(False)


def calibrate(cfg: DictConfig) -> Network:
    """alpha and beta: from ``profile``, else a ping-pong between two ranks of the cluster."""
    if cfg.profile is not None:
        return NetworkProfile.load(cfg.profile).network
    spec = GroupSpec.of(cfg, 2, cfg.backend)
    args = (list(cfg.pingpong.sizes), cfg.pingpong.reps, cfg.realtime)
    samples = run_on_cluster(spec, pingpong, args, timeout=cfg.timeout_s, keep=False)[0]
    alpha, beta = fit_alpha_beta([n for n, _ in samples], [t for _, t in samples])
    return Network(alpha=alpha, beta=beta)


def trace_worker(rank: int, P: int, cfg: dict, alpha: float, beta: float) -> list[dict] | None:
    """Collective. Every reducer and gradient size, ``warmup`` + ``steps`` calls traced; on rank 0,
    one row per traced call (the others return None)."""
    net, device = Network(alpha, beta), netbench.device()
    hosts: list = [None] * P
    dist.all_gather_object(hosts, socket.gethostname())
    if len(set(hosts)) > 1:
        raise RuntimeError("tracerun compares events on one clock: every rank must run on this host")
    rows = []
    for m in cfg["m"]:
        gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)
        grad = torch.randn(m, generator=gen).to(device)
        for name, rcfg in cfg["reducers"].items():
            reducer = instantiate(rcfg, align_timing=cfg["align_timing"])
            trace = RoundTrace(Clock(device))
            if hasattr(type(reducer), "trace"):
                reducer.trace = trace
            k = k_for(reducer.density, m)
            for step in range(cfg["warmup"] + cfg["steps"]):
                if cfg["realtime"] and step == cfg["warmup"]:
                    scheduling(True)
                dist.barrier()
                with collective_trace(trace):
                    reducer.reduce(grad)
                s0, s1 = reducer.commu_span
                events = call_events(trace.take(), s0, s1)
                everyone: list = [None] * P
                dist.all_gather_object(everyone, events)
                if rank == 0 and step >= cfg["warmup"]:
                    b = critical_path(everyone, net, collective_wire=topk_time(P, k, m, net), eager=trace.eager)
                    bound = predict_commu(rcfg, P, m, net)
                    rows.append(
                        {"reducer": name, "m": m, "k": k, "nodes": P, "step": step}
                        | b.as_row()
                        | {"bound": bound, "alpha": alpha, "beta": beta}
                    )
            if cfg["realtime"]:
                scheduling(False)
    return rows if rank == 0 else None


def summarise(rows: list[dict]) -> list[dict]:
    """Per reducer, gradient size and P: the median call (by ``total``; its parts add up to it),
    with the median ``span`` over calls and both against the bound."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["reducer"], r["m"], r["nodes"]), []).append(r)
    out = []
    for (reducer, m, P), calls in groups.items():
        med = sorted(calls, key=lambda r: r["total"])[(len(calls) - 1) // 2]
        span = statistics.median(r["span"] for r in calls)
        path = med["total"] - med["skew"]
        out.append(
            {"reducer": reducer, "m": m, "nodes": P, "calls": len(calls)}
            | {c: med[c] for c in COLUMNS}
            | {"span_median": span, "messages": med["messages"], "path_bytes": med["path_bytes"], "bound": med["bound"]}
            | {"path_over_bound": path / med["bound"], "span_over_bound": span / med["bound"]}
            | {"alpha": med["alpha"], "beta": med["beta"]}
        )
    return out


def table(summary: list[dict]) -> str:
    """The summary as a Markdown table, times in ms."""
    head = "| reducer | m | P | total | skew | wire | transport | software (merge) | path / bound | span / bound |"
    lines = [head, "|" + "---|" * 10]
    for s in summary:
        ms = {c: 1e3 * s[c] for c in COLUMNS} | {"bound": 1e3 * s["bound"]}
        lines.append(
            f"| {s['reducer']} | {s['m']:,} | {s['nodes']} | {ms['total']:.2f} | {ms['skew']:.2f} | "
            f"{ms['wire']:.2f} | {ms['transport']:.2f} | {ms['software']:.2f} ({ms['merge']:.2f}) | "
            f"{s['path_over_bound']:.2f} | {s['span_over_bound']:.2f} |"
        )
    return "\n".join(lines)


@hydra.main(config_path="../../conf", config_name="trace", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:  # bad input: one line, exit 2, before any process starts
        with open_dict(cfg):
            cfg.device, cfg.backend = checks.placement(cfg.device, cfg.backend, wants_gpu=False)
        check(cfg)
        cluster = checks.build(cfg, "cluster")
        for P in cfg.nodes:
            cluster.check(P)
            checks.gpus_fit(cfg.device, P)
    except checks.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    try:
        net = calibrate(cfg)
        print(
            f"alpha {net.alpha * 1e3:.4f} ms, beta {net.beta:.4e} s/byte ({8 / net.beta / 1e9:.3f} Gbit/s)", flush=True
        )
        rows = []
        for P in cfg.nodes:
            spec = GroupSpec.of(cfg, P, cfg.backend)
            got = run_on_cluster(spec, trace_worker, (cfg_dict, net.alpha, net.beta), timeout=cfg.timeout_s)[0]
            rows += got
            print(table(summarise(got)).split("\n", 2)[-1], flush=True)
    finally:
        dispatch.close()
    for r in rows:
        r["dilation"] = cfg_dict["cluster"].get("dilation", 1)
    summary = summarise(rows)
    netbench.write_csv(out / "steps.csv", rows)
    netbench.write_csv(out / "trace.csv", summary)
    print(table(summary))
    print(f"traces: {out / 'steps.csv'}, summary: {out / 'trace.csv'}")


if __name__ == "__main__":
    main()
