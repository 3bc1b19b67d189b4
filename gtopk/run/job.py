"""One job: validate the config, then run P workers on this machine or join torchrun's world.

Everything that can be checked without processes is checked here, before any is spawned
(``gtopk.run.checks``: a one-line error naming the setting and the fix). A job whose
``summary.json`` exists is skipped, so re-running a sweep resumes it; a job runs under its
run directory's lock, and a failed one is recorded and, in a sweep, passed over
(``gtopk.run.jobs``). The workers are a ``gtopk.run.runner`` group: in a sweep (basic
launcher) the next job of the same P, cluster, backend, threads and device reuses it; a
failed job, a single run and a job under another launcher close it.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from gtopk.records.rundir import SUMMARY
from gtopk.run import checks, runner
from gtopk.run.checks import ConfigError
from gtopk.run.cluster import ClusterError
from gtopk.run.jobs import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    JobBusy,
    in_basic_sweep,
    job_failed,
    job_lock,
    job_started,
    start_attempt,
)
from gtopk.run.localprofile import measure_local
from gtopk.run.runner import GroupSpec, run_on_cluster
from gtopk.run.world import PortInUse, WorkerError, join_group
from gtopk.train.compute import MissingLocalProfile, ProfileError
from gtopk.train.data import DataError
from gtopk.train.loop import run_worker

BAD_INPUT = (ConfigError, DataError, PortInUse)  # one-line errors, raised before any worker starts


def validate(cfg: DictConfig) -> None:
    """Bad input (``BAD_INPUT``), found without starting any process."""
    checks.validate(cfg)
    try:
        get_class(cfg.reducer._target_)  # importable
    except Exception as e:  # noqa: BLE001 - any import problem is a bad setting
        raise ConfigError(
            f"reducer._target_={cfg.reducer._target_} cannot be imported ({e}); "
            "pick reducer=dense|topk|gtopk|ddp|ddp_fp16|powersgd or fix the class path"
        ) from None
    device, backend = placement(cfg)
    checks.reducer_settings(cfg, backend)
    cluster = instantiate(cfg.cluster)
    try:
        cluster.check_job(cfg)
    except ClusterError as e:
        raise ConfigError(str(e)) from None
    if torchrun_world() is None:
        checks.machine_fits(cfg, device, cluster.processes(cfg.nodes))
    else:
        checks.local_gpus(device, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    compute = instantiate(cfg.compute)
    if compute.needs_data:
        source = instantiate(cfg.data)
        checks.data_fits(cfg, source.check())
        checks.model_takes(cfg, source.sample_shape())


def torchrun_world() -> tuple[int, int] | None:
    """(rank, world size) when started by torchrun (or any launcher that sets the env)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def placement(cfg: DictConfig) -> tuple[str, str]:
    """(device, backend) of this job: ``device`` and ``backend`` resolved by what its
    compute needs (``gtopk.run.checks.placement``; ConfigError for a pair that cannot run)."""
    return checks.placement(cfg.device, cfg.backend, instantiate(cfg.compute).wants_gpu)


def settle_placement(cfg: DictConfig) -> str:
    """Write the job's resolved device and backend into ``cfg`` (what its workers and
    records see); returns the backend."""
    device, backend = placement(cfg)
    with open_dict(cfg):
        cfg.device, cfg.backend = device, backend
    return backend


def job_position() -> str:
    """'job i of n' within a basic-launcher sweep (n from the sweep's multirun.yaml)."""
    hc = HydraConfig.get()
    num = OmegaConf.select(hc, "job.num", default=None)
    if num is None:
        return "job"
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        sweep = OmegaConf.load(Path(hc.sweep.dir) / "multirun.yaml").hydra
        params = OmegaConf.select(sweep, "sweeper.params", default=None) or {}
        overrides = [f"{k}={v}" for k, v in params.items()] + list(sweep.overrides.task)
        axes = {}  # key -> number of values; a command-line key replaces the config's
        for o in OverridesParser.create().parse_overrides(overrides):
            axes[o.get_key_element()] = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
        n = 1
        for count in axes.values():
            n *= count
        return f"job {num + 1} of {n}"
    except Exception:  # noqa: BLE001 - other sweepers: the index alone
        return f"job {num + 1}"


def run_job(cfg: DictConfig) -> float | None:
    """Run the job described by ``cfg``; returns images/s per worker (None when it did
    not finish in a sweep, or on torchrun ranks other than 0). Bad input and failures are
    reported by ``gtopk.run.jobs.job_failed`` (exit, or on with the sweep); Ctrl-C stops."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    job_started()
    try:
        try:
            validate(cfg)
            if torchrun_world() is not None:  # torchrun supervises; every rank shares run_dir
                return _run(cfg, run_dir)
            with job_lock(run_dir):
                return _run(cfg, run_dir)
        except BaseException:
            runner.close()  # a failed job leaves no workers behind: the next job starts afresh
            raise
    except BAD_INPUT as e:
        job_failed(run_dir, str(e), EXIT_BAD_INPUT, {"type": type(e).__name__})
    except JobBusy as e:
        job_failed(run_dir, str(e), EXIT_BAD_INPUT)  # the run directory is another process's
    except WorkerError as e:
        job_failed(run_dir, e.summary(), EXIT_FAILED, {"type": "WorkerError", "failures": e.failures}, str(e))
    except Exception as e:  # noqa: BLE001 - any other failure of this job: recorded, reported
        text = traceback.format_exc()
        job_failed(
            run_dir,
            f"{type(e).__name__}: {e}".splitlines()[0],
            EXIT_FAILED,
            {"type": type(e).__name__, "traceback": text},
            text,
        )
    except KeyboardInterrupt:
        print(
            f"interrupted: {run_dir} stopped; re-run the same command to resume (finished jobs are skipped)",
            file=sys.stderr,
            flush=True,
        )
        raise
    return None


def resolve_compute(cfg: DictConfig) -> None:
    """Write what the compute settles before any worker starts (replay's t_compute) into
    ``cfg.compute``; a local profile without this job's entry is measured first."""
    try:
        try:
            settings = instantiate(cfg.compute).resolve(cfg)
        except MissingLocalProfile:
            measure_local(cfg)  # at P = 1, through the same runner
            settings = instantiate(cfg.compute).resolve(cfg)
    except ProfileError as e:
        raise ConfigError(str(e)) from None
    with open_dict(cfg):
        cfg.compute.update(settings)


def _run(cfg: DictConfig, run_dir: Path) -> float | None:
    """The job itself (under its lock unless torchrun started it)."""
    summary_path = run_dir / SUMMARY
    if summary_path.exists():
        print(f"{job_position()}: skipping {run_dir}: {SUMMARY} exists (delete it to re-run)", flush=True)
        return json.loads(summary_path.read_text()).get("images_per_s_per_worker")
    backend = settle_placement(cfg)
    resolve_compute(cfg)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    world = torchrun_world()
    if world is None:
        cfg_dict["attempt"] = attempt = start_attempt(run_dir)
        again = f", attempt {attempt}" if attempt > 1 else ""
        print(f"{job_position()}: {run_dir} ({cfg.nodes} workers, {backend}{again})", flush=True)
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        cluster = instantiate(cfg.cluster)  # its processes run its entry (cluster=simulated: one for all)
        summary = run_on_cluster(
            GroupSpec.of(cfg, cluster.processes(cfg.nodes), backend, threads_for=cfg.nodes),
            cluster.entry(),
            (cfg_dict, str(run_dir)),
            timeout=cfg.timeout_s,
            collective_timeout=cfg.collective_timeout_s,
            keep=in_basic_sweep(),  # the sweep's next job may reuse the group
        )[0]
    else:
        rank, size = world
        if size != cfg.nodes:
            raise ConfigError(f"nodes={cfg.nodes} but torchrun started WORLD_SIZE={size}; pass nodes={size}")
        if cfg.cluster_name != "local":
            raise ConfigError(
                f"cluster={cfg.cluster_name} under torchrun: torchrun's world is the cluster; pass cluster=local"
            )
        if rank == 0:
            OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        join_group(backend, cfg.timeout_s, cfg.collective_timeout_s)
        try:
            summary = run_worker(rank, size, cfg_dict, str(run_dir))
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return None
    print(
        f"done: {summary['images_per_s_per_worker']:.1f} images/s per worker, "
        f"t_iter {summary['t_iter']:.3f}s -> {summary_path}",
        flush=True,
    )
    return summary["images_per_s_per_worker"]
