"""``python -m gtopk.perf.netbench``: measure a cluster's network and every reducer's collective.

1. Ping-pong (``dist.send``/``dist.recv``) between ranks 0 and 1 over message sizes; the
   one-way time per size (half the median round trip) is fitted to ``alpha + beta * n``
   and saved as a network profile (``runs/net/<name>/profile.json``), with the software cost
   per message of the sparse reducers' own rounds (``gtopk.perf.software``: a gTop-k tree
   reduce of a small gradient between the same two ranks, beyond its alpha-beta time) and
   the latency of a step of the backend's own ring collectives (``ring_alpha``: its
   all-reduce of the two ranks' flags, per step; ``gtopk.perf.latency`` has the measurements),
   and that step again with P ranks up for each P of ``ring.nodes`` (``ring_alpha_at``: the
   model's ring step at P, ``NetworkProfile.ring_step``).
2. Each reducer of ``collectives.reducers`` (dense all-reduce, Top-k all-gather, gTop-k
   tree and recursive doubling) is run for every P in ``collectives.nodes`` and gradient
   size in ``collectives.m`` with ``align_timing`` on (every rank starts the collective
   together after its local selection, and waits after it until all are done); per
   iteration the slowest rank's t_commu is the collective's time, and the median over
   iterations is written to ``collectives.csv`` beside the fitted model's prediction (and
   the software cost per message measured at that P, ``software_at_P``).

Runs on any cluster: ``cluster=local`` (loopback), ``cluster=emulated`` (shaped namespaces),
or a real one under torchrun (ping-pong between global ranks 0 and 1, collectives at the
world's size only).
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from gtopk.perf import software
from gtopk.perf.latency import (
    SMALL_BYTES,
    SMALL_REPS,
    device,
    on_one_host,
    pingpong,
    ring_latency,
    round_latency,
    span,
)
from gtopk.perf.model import predict_commu
from gtopk.perf.netprofile import NetworkProfile, fit_alpha_beta
from gtopk.reducers.costmodel import Network, rd_time
from gtopk.run import checks, dispatch
from gtopk.run.dispatch import GroupSpec, run_on_cluster
from gtopk.run.execute import torchrun_world
from gtopk.run.settings import is_int
from gtopk.run.world import join_group


def time_reducer(
    rank: int,
    world: int,
    reducer_cfg: dict,
    m: int,
    warmup: int,
    iters: int,
    seed: int,
    one_clock: bool,
    spans: list | None = None,
) -> dict | None:
    """Collective. The reducer runs with ``align_timing`` (every rank starts the collective
    after a barrier and waits at another after it, so no rank's selection or
    post-processing overlaps it). Medians over iterations, on rank 0, of:
    t_commu: from the last rank's start to the last rank holding the result, on one shared
      clock when every rank runs on this host (the barrier's exit skew excluded), else the
      slowest rank's t_commu;
    t_commu_slowest: the slowest rank's own t_commu (the barrier's exit skew included);
    t_commu_min: the fastest rank's (e.g. a tree's root, done before the broadcast reaches
      the leaves); t_compr and t_merge: the largest over ranks.
    ``spans``: a list that gets each timed iteration's t_commu (on every rank)."""
    reducer = instantiate(reducer_cfg, align_timing=True)
    grad = torch.randn(m, generator=torch.Generator().manual_seed(seed + rank), device="cpu").to(device())
    rows = []
    for i in range(warmup + iters):
        dist.barrier()
        _, rec = reducer.reduce(grad)
        mine = torch.tensor(
            [rec.t_commu, rec.t_compr, rec.t_merge, *reducer.commu_span], dtype=torch.float64, device=device()
        )
        everyone = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        t = torch.stack(everyone)
        if i >= warmup:
            rows.append(
                (
                    span(t[:, 3], t[:, 4], one_clock),
                    t[:, 0].max().item(),
                    t[:, 0].min().item(),
                    t[:, 1].max().item(),
                    t[:, 2].max().item(),
                )
            )
            if spans is not None:
                spans.append(rows[-1][0])
    if rank:
        return None
    med = [statistics.median(r[j] for r in rows) for j in range(5)]
    return {
        "t_commu": med[0],
        "t_commu_slowest": med[1],
        "t_commu_min": med[2],
        "t_compr": med[3],
        "t_merge": med[4],
        "bytes_sent": rec.bytes_sent,
        "messages_sent": rec.messages_sent,
    }


def reduce_spans(rank: int, world: int, cfg: dict) -> list[float] | None:
    """Collective. ``collectives.warmup`` + ``software.samples`` reduces of ``software.reducer``
    (one instance) on a gradient of ``software.m`` entries, timed by ``time_reducer``;
    on rank 0 the t_commu span of each timed one, the others None."""
    s, spans = cfg["software"], []
    args = (s["reducer"], s["m"], cfg["collectives"]["warmup"], s["samples"], cfg["seed"], on_one_host(world))
    time_reducer(rank, world, *args, spans=spans)
    return spans if rank == 0 else None


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of this machine so far (Linux /proc/stat; zeros elsewhere).
    Busy includes kernel networking (softirq), which is what an emulated link costs."""
    try:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = v[3] + (v[4] if len(v) > 4 else 0.0)
    return sum(v) - idle, sum(v)


def _run_pingpong(rank: int, world: int, cfg: dict):
    """Collective: the ping-pong's samples and the ring step's latency (rank 0; else None)."""
    samples = pingpong(rank, world, list(cfg["pingpong"]["sizes"]), cfg["pingpong"]["reps"])
    ring = ring_latency(rank, world, SMALL_REPS, on_one_host(world))
    return (samples, ring) if rank == 0 else None


def _run_ring(rank: int, world: int, cfg: dict) -> float | None:
    """Collective: the ring step's latency with ``world`` ranks up (rank 0; else None)."""
    return ring_latency(rank, world, cfg["ring"]["reps"], on_one_host(world))


def ring_steps(cfg: DictConfig, cfg_dict: dict, at_pair: float) -> dict[int, float]:
    """Collective, one group per P: the ring step at each P of ``ring.nodes`` (P = 2: the
    ping-pong pair's ``at_pair``; under torchrun only the world's, which ``at_pair`` is)."""
    if torchrun_world():
        return {dist.get_world_size(): at_pair}
    out = {2: at_pair}
    for P in sorted(set(cfg.ring.nodes) - {1, 2}):
        out[P] = _on_cluster(_run_ring, P, cfg, cfg_dict)
    return out


def _run_collectives(rank: int, world: int, cfg: dict):
    c = cfg["collectives"]
    out = []
    one_clock = on_one_host(world)
    latency = round_latency(rank, world, c["latency_reps"], one_clock) if world > 1 else None
    small = reduce_spans(rank, world, cfg) if world > 1 else None
    for m in c["m"]:
        for name, rcfg in c["reducers"].items():
            busy0, total0 = cpu_times()
            r = time_reducer(rank, world, rcfg, m, c["warmup"], c["iters"], cfg["seed"], one_clock)
            busy1, total1 = cpu_times()
            if r:
                r["cpu_busy"] = (busy1 - busy0) / (total1 - total0) if total1 > total0 else None
                r["link_utilisation"] = None
                if "bandwidth_bits_per_s" in cfg["cluster_info"] and r["t_commu"] > 0:
                    r["link_utilisation"] = (
                        8 * r["bytes_sent"] / r["t_commu"] / cfg["cluster_info"]["bandwidth_bits_per_s"]
                    )
                out.append(
                    {"reducer": name, "nodes": world, "m": m, "density": c["density"], "rd_latency": latency, **r}
                    | {"software_t_commu": statistics.median(small) if small else None}
                )
    return out if rank == 0 else None


def _on_cluster(fn, nodes: int, cfg: DictConfig, cfg_dict: dict):
    """Run ``fn`` on ``nodes`` ranks of the configured cluster (or torchrun's world), in
    ``gtopk.run.dispatch``'s group of ``nodes`` workers (kept for the next call at the same
    P; ``main`` closes it). The emulated cluster's ``min_dilation`` keeps the calibration
    pair out of real time on a machine where ``auto`` would give two ranks D = 1."""
    if torchrun_world():
        return fn(dist.get_rank(), dist.get_world_size(), cfg_dict)
    instantiate(cfg.cluster).check(nodes, device=cfg.device)
    checks.gpus_fit(cfg.device, nodes)  # NCCL: one GPU per rank ("Duplicate GPU detected")
    spec = GroupSpec.of(cfg, nodes, cfg.backend)
    return run_on_cluster(spec, fn, (cfg_dict,), timeout=cfg.timeout_s, keep=True)[0]


def write_csv(path: Path, rows: list[dict]) -> None:
    """``rows`` as CSV at ``path``, columns from the first row (local file work)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


@hydra.main(config_path="../../conf", config_name="netbench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:  # bad input: one line, exit 2, before anything runs
        with open_dict(cfg):
            # auto: the CPU and gloo (collectives of CPU tensors need no GPU); device=cuda or
            # backend=nccl: NCCL on this machine's GPUs, one per rank
            cfg.device, cfg.backend = checks.placement(cfg.device, cfg.backend, wants_gpu=False)
        cluster = checks.build(cfg, "cluster")
        if not all(is_int(P) and P >= 1 for P in cfg.ring.nodes):
            raise checks.ConfigError(
                f"ring.nodes={list(cfg.ring.nodes)} must be numbers of ranks >= 1, e.g. ring.nodes=[2,4,8]"
            )
    except checks.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    cfg_dict["cluster_info"] = {} if torchrun_world() else cluster.describe()
    if torchrun_world():
        join_group(cfg.backend, cfg.timeout_s, cfg.timeout_s)  # under NCCL: binds LOCAL_RANK's GPU first
    try:
        samples, ring_alpha = _on_cluster(_run_pingpong, 2, cfg, cfg_dict) or (None, None)
        spans = _on_cluster(reduce_spans, 2, cfg, cfg_dict)  # the sparse rounds' software cost
        ring_at = ring_steps(cfg, cfg_dict, ring_alpha) if samples is not None else {}
        if samples is not None:
            alpha, beta = fit_alpha_beta([n for n, _ in samples], [t for _, t in samples])
            big, t_big = samples[-1]
            cluster = instantiate(cfg.cluster).describe()
            P_sw = dist.get_world_size() if torchrun_world() else 2  # the world the spans were timed on
            sw = software.summary(spans, cfg_dict, P_sw, Network(alpha, beta))
            prof = NetworkProfile(
                alpha=alpha,
                beta=beta,
                name=cfg.name,
                cluster=cluster,
                backend=cfg.backend,
                samples=samples,
                ring_alpha=ring_alpha,
                ring_alpha_at={str(P): t for P, t in ring_at.items()},
                notes=f"ping-pong between 2 ranks, {cfg.pingpong.reps} round trips per size "
                f"(at least {SMALL_REPS} up to {SMALL_BYTES} bytes)",
                **sw,
            )
            prof.save(out / "profile.json")
            write_csv(
                out / "pingpong.csv",
                [{"bytes": n, "one_way_s": t, "fit_s": alpha + beta * n, "bits_per_s": 8 * n / t} for n, t in samples],
            )
            print(
                f"network profile {out / 'profile.json'}: alpha {alpha * 1e3:.4f} ms, beta {beta:.4e} s/byte "
                f"({prof.bits_per_s / 1e9:.3f} Gbit/s); {big} B one way at {8 * big / t_big / 1e9:.3f} Gbit/s"
            )
            print(
                f"ring step {ring_alpha * 1e3:.4f} ms: the median of {SMALL_REPS} all-reduces of the flags of "
                f"{dist.get_world_size() if torchrun_world() else 2} ranks over their ring steps; with P ranks up: "
                + ", ".join(f"P = {P} {t * 1e3:.4f} ms" for P, t in sorted(ring_at.items()))
            )
            print(software.describe(prof.software, prof.software_samples, prof.software_notes))
            if "bandwidth_bits_per_s" in cluster:
                conf = cluster["bandwidth_bits_per_s"]
                print(
                    f"configured {conf / 1e9:.3f} Gbit/s: large messages get {8 * big / t_big / conf:.1%}, "
                    f"the fitted beta {prof.bits_per_s / conf:.1%} of it"
                )
        sizes = [dist.get_world_size()] if torchrun_world() else list(cfg.collectives.nodes)
        rows = []
        for P in sizes:
            for r in _on_cluster(_run_collectives, P, cfg, cfg_dict) or []:
                rcfg = cfg_dict["collectives"]["reducers"][r["reducer"]]
                r["t_commu_model"] = predict_commu(rcfg, P, r["m"], prof.network) if samples else None
                r["alpha_at_P"] = r["t_commu_model_at_P"] = None
                if samples and r["rd_latency"] is not None:
                    rounds = rd_time(P, 8, Network(alpha=1.0, beta=0.0))
                    wire = rd_time(P, 8, Network(alpha=0.0, beta=prof.beta))
                    at_P = Network(alpha=(r["rd_latency"] - wire) / rounds, beta=prof.beta)
                    r["alpha_at_P"] = at_P.alpha
                    r["t_commu_model_at_P"] = predict_commu(rcfg, P, r["m"], at_P)
                r["software_at_P"] = (
                    software.at_P(r["software_t_commu"], cfg_dict, P, prof.network) if samples else None
                )
                rows.append(r)
                print(
                    f"P={P:<3} m={r['m']:<9} {r['reducer']:<11} t_commu {r['t_commu']:.4f}s "
                    f"(slowest rank's own {r['t_commu_slowest']:.4f}s) model {r['t_commu_model']:.4f}s "
                    f"ratio {r['t_commu'] / r['t_commu_model']:.2f}  t_merge {r['t_merge']:.4f}s "
                    f"t_compr {r['t_compr']:.4f}s cpu busy {r['cpu_busy'] or 0:.0%}"
                    + (
                        f" | alpha at P {r['alpha_at_P'] * 1e3:.3f} ms: model {r['t_commu_model_at_P']:.4f}s ratio "
                        f"{r['t_commu'] / r['t_commu_model_at_P']:.2f}"
                        if r["alpha_at_P"] is not None
                        else ""
                    )
                    + (f" | software {r['software_at_P'] * 1e3:.3f} ms" if r["software_at_P"] is not None else "")
                    + (f" link {r['link_utilisation']:.0%}" if r["link_utilisation"] is not None else ""),
                    flush=True,
                )
        if rows and samples is not None:
            write_csv(out / "collectives.csv", rows)
            print(f"collectives: {out / 'collectives.csv'}")
    finally:
        dispatch.close()
        if torchrun_world():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
