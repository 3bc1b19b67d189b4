"""One job: decide from its run directory, validate the config, then run P workers on this
machine or join torchrun's world.

A job's identity is its resolved config (``gtopk.records.identity``). First, before any
check that needs the machine, the run directory decides: finished with the same settings,
the job is skipped (so re-running a sweep resumes it); holding a result or checkpoint of
other settings, it is refused in one line naming the settings that differ, unless
``rerun=true`` moves the old result aside; a finished training run of the same cell with
fewer epochs is trained longer from its last checkpoint where that is exact, else refused
naming why (``gtopk.records.extension``); an unreadable ``summary.json`` is quarantined and
the job runs again. Then everything that can be checked without processes is checked,
before any is spawned (``gtopk.run.checks``: a one-line error naming the setting and the
fix). A job runs under its run directory's lock, and a failed one is recorded and, in a
sweep, passed over (``gtopk.run.jobs``). The workers are a ``gtopk.run.dispatch`` group: in a sweep (basic
launcher) the next job of the same P, cluster, backend, threads and device reuses it; a
failed job, a single run and a job under another launcher close it.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from gtopk.records.claim import ForeignFolder, claim
from gtopk.records.extension import Extension, consider, continued
from gtopk.records.identity import Verdict, fingerprint, identity, move_aside, quarantine, verdict, write_identity
from gtopk.records.rundir import SUMMARY, CorruptRecord, RunDir, iter_jsonl
from gtopk.records.summary import summarizable
from gtopk.run import checks, dispatch
from gtopk.run.checks import ConfigError
from gtopk.run.cluster import ClusterError
from gtopk.run.dispatch import GroupSpec, run_on_cluster
from gtopk.run.jobs import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    JobBusy,
    agree_on_lock,
    in_basic_sweep,
    job_failed,
    job_lock,
    job_started,
    start_attempt,
    torchrun_lock,
)
from gtopk.run.measure_compute import measure_local
from gtopk.run.settings import check_rerun
from gtopk.run.supervise import signals_stop
from gtopk.run.world import PortInUse, WorkerError, join_group
from gtopk.train.checkpoint import saved_generation
from gtopk.train.compute import MissingLocalProfile, ProfileError
from gtopk.train.data import DataError
from gtopk.train.loop import run_worker
from gtopk.train.recipe import first_difference

BAD_INPUT = (ConfigError, DataError, PortInUse)  # one-line errors, raised before any worker starts


def validate(cfg: DictConfig) -> None:
    """Bad input (``BAD_INPUT``), found without starting any process."""
    built = checks.validate(cfg)  # every node built once (the reducer's class importable), one line each
    compute, cluster = built["compute"], built["cluster"]
    device, backend = checks.placement(cfg.device, cfg.backend, compute.wants_gpu)
    checks.reducer_settings(cfg, backend)
    try:
        cluster.check_job(cfg)
    except ClusterError as e:
        raise ConfigError(str(e)) from None
    if torchrun_world() is None:
        checks.machine_fits(cfg, device, cluster.processes(cfg.nodes))
    else:
        checks.local_gpus(device, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    if compute.needs_data:
        source = built["data"]
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
    return checks.placement(cfg.device, cfg.backend, checks.build(cfg, "compute").wants_gpu)


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
        with signals_stop():  # SIGTERM / SIGHUP at any point: SystemExit, reported below as Ctrl-C is
            return _job(cfg, run_dir)
    except ForeignFolder as e:
        job_failed(run_dir, str(e), EXIT_BAD_INPUT)  # not the project's folder: nothing is written there
    except OtherSettings as e:
        job_failed(run_dir, str(e), EXIT_BAD_INPUT)  # the folder's records are another run's: untouched
    except BAD_INPUT as e:
        job_failed(run_dir, str(e), EXIT_BAD_INPUT, {"type": type(e).__name__})
    except JobBusy as e:
        job_failed(run_dir, str(e), EXIT_BAD_INPUT)  # the run directory is another process's
    except WorkerError as e:
        if disk_full(run_dir):  # the disk's, not the job's: one line saying what to do
            line = f"the disk holding {run_dir} is full ({e.summary()}); free space, then re-run the same command to resume"
            job_failed(run_dir, line, EXIT_BAD_INPUT, {"type": "DiskFull", "failures": e.failures}, str(e))
        else:
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
        interrupted(run_dir)
        raise
    except SystemExit as e:  # SIGTERM or SIGHUP (gtopk.run.supervise.signals_stop): stopped as Ctrl-C stops
        if e.code in STOP_CODES:
            interrupted(run_dir)
        raise
    return None


#: the exit statuses of a job stopped by SIGTERM or SIGHUP (``signals_stop``)
STOP_CODES = (128 + signal.SIGTERM, 128 + signal.SIGHUP)


def interrupted(run_dir: Path) -> None:
    print(
        f"interrupted: {run_dir} stopped; re-run the same command to resume (finished jobs are skipped)",
        file=sys.stderr,
        flush=True,
    )


def _job(cfg: DictConfig, run_dir: Path) -> float | None:
    """``run_job``'s work: the folder claimed, the verdict, the checks, the job under its
    lock; any failure closes the worker group before it propagates."""
    try:
        ident = job_identity(cfg)
        claim(run_dir)  # the folder is new, empty or a job's of this project: else refused, untouched
        first = decide(run_dir, ident, cfg)  # read-only: before any check of the machine
        if first.action == "skip":
            return skipped(run_dir, first.value)
        validate(cfg)
        if (world := torchrun_world()) is not None:  # torchrun supervises; rank 0 holds run_dir's lock
            with torchrun_lock(run_dir, world[0]) as refusal:
                now = decide(run_dir, ident, cfg, settle=world[0] == 0 and refusal is None)
                if now.action == "skip":
                    return skipped(run_dir, now.value)
                return _run(cfg, run_dir, ident, refusal, now.extends)
        with job_lock(run_dir):
            now = decide(run_dir, ident, cfg, settle=True)  # again, under the lock
            if now.action == "skip":
                return skipped(run_dir, now.value)
            return _run(cfg, run_dir, ident, extends=now.extends)
    except BaseException:
        dispatch.close()  # a failed job leaves no workers behind: the next job starts afresh
        raise


class OtherSettings(ConfigError):
    """The run directory holds a result or checkpoint of other settings (and ``rerun`` is false)."""


def job_identity(cfg: DictConfig) -> dict:
    """The job's identity (``gtopk.records.identity.identity``); a config that does not
    resolve is bad input (``validate``'s message first, where it names the setting)."""
    try:
        return identity(cfg)
    except Exception as e:  # noqa: BLE001 - an interpolation that cannot resolve
        validate(cfg)
        raise ConfigError(f"the config does not resolve: {str(e).splitlines()[0]}") from None


def decide(run_dir: Path, ident: dict, cfg: DictConfig, settle: bool = False) -> Verdict:
    """What the run directory holds for this job (local). ``settle`` (under the job's lock,
    or on torchrun's rank 0): an unreadable ``summary.json`` is quarantined, and with
    ``rerun=true`` a result of other settings is moved aside. Without it, a finished run
    of the same cell with fewer epochs is trained longer (``Verdict.extends``:
    ``gtopk.records.extension``). Raises ``OtherSettings`` when a result of other
    settings stays."""
    rerun = check_rerun(cfg.get("rerun", False))
    run = RunDir(run_dir)
    if settle and run.summary.exists():
        try:
            run.read_summary()
        except CorruptRecord as e:
            quarantine(run.summary, str(e))
    gen = saved_generation(run_dir, verify=False) if run.checkpoints.exists() else None  # the workers verify
    saved = None if gen is None else gen.get("fingerprint")
    v = verdict(run_dir, ident, saved, gen is not None)
    if v.action == "run" and settle and gen is not None and not _rows_kept(run, gen):
        # a checkpoint whose steps' records are lost: resuming would leave the steps unrecorded
        dest = move_aside(run_dir)
        print(
            f"warning: {run.iters(0)} lost the rows of epochs its checkpoint holds; the run's records were moved to "
            f"{dest} and the job trains from the start",
            file=sys.stderr,
            flush=True,
        )
        return Verdict("run")
    if v.action != "refuse":
        return v
    if not rerun:
        longer = consider(run_dir, ident, gen, first_difference)
        if isinstance(longer, Extension):
            return Verdict("run", extends=longer)
        raise OtherSettings(longer or v.why)
    if settle:
        dest = move_aside(run_dir)
        print(f"rerun=true: the result of other settings moved to {dest}", flush=True)
    return Verdict("run")


def disk_full(run_dir: Path) -> bool:
    """Whether the file system holding ``run_dir`` has no block left for the job."""
    try:
        return os.statvfs(run_dir).f_bavail == 0
    except OSError:
        return False


def _rows_kept(run: RunDir, generation: dict) -> bool:
    """Whether rank 0's iteration rows still hold a usable step of every epoch the
    checkpoint ``generation`` covers (warm-up steps count: they are steps)."""
    epochs = {r.get("epoch") for r in iter_jsonl(run.iters(0)) if summarizable(r)}
    return all(e in epochs for e in range(int(generation.get("epoch", -1)) + 1))


def skipped(run_dir: Path, value: float | None) -> float | None:
    print(
        f"{job_position()}: skipping {run_dir}: finished with these settings (another name= runs it again)", flush=True
    )
    return value


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


def _run(
    cfg: DictConfig, run_dir: Path, ident: dict, refusal: JobBusy | None = None, extends: Extension | None = None
) -> float | None:
    """The job itself (under its lock; under torchrun, rank 0 holds it or ``refusal`` says
    why not), its run directory free or holding work of the same settings, or a finished
    run that it trains longer (``extends``; ``decide``)."""
    summary_path = run_dir / SUMMARY
    backend = settle_placement(cfg)
    resolve_compute(cfg)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    cfg_dict["fingerprint"] = fp = fingerprint(ident)
    run_dir.mkdir(parents=True, exist_ok=True)
    world = torchrun_world()
    # the finished run this job continues, kept in identity.json while its checkpoint may be loaded
    carried = continued(run_dir, fp) if extends is None else extends.carried()
    if carried:
        cfg_dict["extends"] = {"fingerprint": carried["fingerprint"]}  # its checkpoint resumes (Ranks.extends)
    if world is None:
        cfg_dict["attempt"] = attempt = start_attempt(run_dir, extends and {"extended": extends.attempt()})
        again = f", attempt {attempt}" if attempt > 1 else ""
        print(f"{job_position()}: {run_dir} ({cfg.nodes} workers, {backend}{again})", flush=True)
        if extends:
            print(f"extending the finished run of {extends.old_epochs} epochs to {extends.new_epochs}", flush=True)
        write_identity(run_dir, ident, carried)
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
        if rank == 0 and refusal is None:  # rank 0 holds run_dir's lock (torchrun_lock)
            write_identity(run_dir, ident, carried)
            OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        join_group(backend, cfg.timeout_s, cfg.collective_timeout_s)
        try:
            agree_on_lock(refusal)  # collective: rank 0 was refused -> JobBusy on every rank (exit 2)
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
