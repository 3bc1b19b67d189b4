"""One job: validate the config, then run P workers on this machine or join torchrun's world.

Everything that can be checked without processes is checked here, before any is spawned.
A job whose ``summary.json`` exists is skipped, so re-running a sweep resumes it.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from gtopk.cluster import ClusterError
from gtopk.compute import ProfileError

from gtopk.launch import spawn
from gtopk.reducers import validate_density
from gtopk.records import SUMMARY, write_json_atomic
from gtopk.train import run_worker

MODES = ("benchmark", "train")


class ConfigError(ValueError):
    """A setting is invalid; the message names it and the fix."""


def validate(cfg: DictConfig) -> None:
    if not isinstance(cfg.nodes, int) or cfg.nodes < 1:
        raise ConfigError(f"nodes={cfg.nodes!r} must be an integer >= 1, e.g. nodes=4")
    validate_density(cfg.density)
    if cfg.mode not in MODES:
        raise ConfigError(f"mode={cfg.mode!r} is unknown; choose one of {', '.join(MODES)}")
    if cfg.batch_size < 1 or cfg.grad_accum < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} and grad_accum={cfg.grad_accum} must be >= 1")
    if cfg.benchmark.iters < 1:
        raise ConfigError(f"benchmark.iters={cfg.benchmark.iters} must be >= 1")
    get_class(cfg.reducer._target_)  # importable
    compute = instantiate(cfg.compute)
    if compute.needs_data:
        instantiate(cfg.data).check()
    try:
        instantiate(cfg.cluster).check(cfg.nodes)
    except ClusterError as e:
        raise ConfigError(str(e)) from None


def torchrun_world() -> tuple[int, int] | None:
    """(rank, world size) when started by torchrun (or any launcher that sets the env)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def resolve_backend(cfg: DictConfig) -> str:
    if cfg.backend != "auto":
        return cfg.backend
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    return "nccl" if use_cuda else "gloo"


def job_position() -> str:
    """'job i of n' within a basic-launcher sweep (n from the sweep's multirun.yaml)."""
    hc = HydraConfig.get()
    num = OmegaConf.select(hc, "job.num", default=None)
    if num is None:
        return "job"
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        task = OmegaConf.load(Path(hc.sweep.dir) / "multirun.yaml").hydra.overrides.task
        n = 1
        for o in OverridesParser.create().parse_overrides(list(task)):
            if o.is_sweep_override():
                n *= len(list(o.sweep_string_iterator()))
        return f"job {num + 1} of {n}"
    except Exception:  # noqa: BLE001 - other sweepers: the index alone
        return f"job {num + 1}"


def run_job(cfg: DictConfig) -> float | None:
    """Run the job described by ``cfg``; returns images/s per worker (None when skipped)."""
    validate(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    summary_path = run_dir / SUMMARY
    if summary_path.exists():
        print(f"{job_position()}: skipping {run_dir}: {SUMMARY} exists (delete it to re-run)", flush=True)
        return json.loads(summary_path.read_text()).get("images_per_s_per_worker")
    try:
        with open_dict(cfg):
            cfg.compute.update(instantiate(cfg.compute).resolve(cfg))  # e.g. replay's t_compute
    except ProfileError as e:
        raise ConfigError(str(e)) from None
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    backend = resolve_backend(cfg)
    world = torchrun_world()
    if world is None:
        print(f"{job_position()}: {run_dir} ({cfg.nodes} workers, {backend})", flush=True)
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        with instantiate(cfg.cluster).up(cfg.nodes) as placement:  # torn down on any exit
            summary = spawn(run_worker, cfg.nodes, (cfg_dict, str(run_dir)), backend=backend,
                            timeout=cfg.timeout_s, placement=placement)[0]
    else:
        rank, size = world
        if size != cfg.nodes:
            raise ConfigError(f"nodes={cfg.nodes} but torchrun started WORLD_SIZE={size}; pass nodes={size}")
        if cfg.cluster_name != "local":
            raise ConfigError(f"cluster={cfg.cluster_name} under torchrun: torchrun's world is the cluster; "
                              "pass cluster=local")
        if rank == 0:
            OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout_s))
        try:
            summary = run_worker(rank, size, cfg_dict, str(run_dir))
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return None
    print(f"done: {summary['images_per_s_per_worker']:.1f} images/s per worker, "
          f"t_iter {summary['t_iter']:.3f}s -> {summary_path}", flush=True)
    return summary["images_per_s_per_worker"]
