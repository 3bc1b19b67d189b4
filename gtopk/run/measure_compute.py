"""Measuring the local compute profile (``compute.profile=local``, see
``gtopk.train.compute``): this job's model at P = 1 with real forward and backward, a
short benchmark on loopback run through ``gtopk.run.dispatch`` like any job, its
throughput added to ``runs/profiles/local.json``. Called by ``gtopk.run.execute`` when
resolving the compute raises ``MissingLocalProfile``, before the job's own workers start."""

from __future__ import annotations

import json
import time
from typing import Any

from omegaconf import OmegaConf

from gtopk.records import compute_profiles
from gtopk.run import checks
from gtopk.run.dispatch import GroupSpec, run_on_cluster
from gtopk.run.world import threads_per_worker
from gtopk.train import compute
from gtopk.train.loop import run_worker

#: the measurement's own settings: one worker on loopback, dense (no selection), no faults
LOCAL_CLUSTER = {"_target_": "gtopk.run.cluster.LocalCluster"}
BENCHMARK = {"warmup": 2, "iters": 5}


def measure_local(cfg: Any) -> dict:
    """Measure ``cfg``'s model, batch and device at P = 1 (cores / 1 intra-op threads, the
    default of a single worker) and add the entry to the local profile; returns it."""
    key = compute_profiles.profile_key(cfg)
    run_dir = compute_profiles.LOCAL_PROFILE.parent / "local" / key.replace("/", "_")
    run_dir.mkdir(parents=True, exist_ok=True)
    job = OmegaConf.to_container(cfg, resolve=True)
    job.update(
        nodes=1,
        compute={"_target_": f"{compute.__name__}.MeasuredCompute"},
        logger={**job["logger"], "wandb": False},
        fault={"kind": None, "rank": 0, "at_iter": 0},
        reducer={"_target_": "gtopk.reducers.DenseReducer", "bucket_mb": 25.0},
        benchmark=BENCHMARK,
        cluster=LOCAL_CLUSTER,
    )
    print(f"compute.profile=local: measuring {key} at P = 1 -> {compute_profiles.LOCAL_PROFILE}", flush=True)
    device, backend = checks.placement(str(cfg.device), "auto", wants_gpu=True)  # the job's device, its backend
    spec = GroupSpec(1, backend, threads_per_worker(1), device, json.dumps(LOCAL_CLUSTER, sort_keys=True))
    summary = run_on_cluster(spec, run_worker, (job, str(run_dir)), timeout=float(cfg.timeout_s))[0]
    images = compute.images_per_step(cfg)
    entry = {
        "images_per_s": images / summary["t_compute"],
        "t_compute": summary["t_compute"],
        "images_per_step": images,
        "host": summary["env"]["host"],
        "cpu": summary["env"]["cpu"],
        "run_dir": str(run_dir),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    compute_profiles.save_local_entry(key, entry)
    return entry
