"""``python -m gtopk.run.batch KEY=VALUE...``: many benchmark jobs, one worker group per P.

``run.py -m`` starts P fresh worker processes for every job; on a small machine that
start-up (P interpreters importing torch, a cluster built and torn down) costs far more
than a short benchmark itself (measured on a 2-core VM: about 20 s for a P = 1 job and
60 s at P = 8, for a few seconds of iterations). This runner takes the same overrides,
sweeps included (``reducer=dense,gtopk nodes=1,2,4,8``), composes every job exactly as
``run.py -m`` would (same ``conf/``, same run directory ``runs/<name>/<override_dirname>``,
same resolved ``config.yaml``), validates all of them before anything starts, and then
runs the jobs of each (cluster, P) in one group of P workers, one after another
(``gtopk.train.loop.run_worker`` per job, as ``run.py`` does). The records are the same.

Finished jobs (``summary.json`` present) are skipped. A job that fails stops its group;
the other groups still run, the failed ones are listed at the end (exit status 1), and
a re-run retries exactly the unfinished jobs.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from gtopk.records.rundir import SUMMARY
from gtopk.run.job import ConfigError, resolve_backend, validate
from gtopk.run.spawn import WorkerError, spawn
from gtopk.train.compute import ProfileError
from gtopk.train.loop import run_worker

CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass
class Job:
    """One composed, validated job."""

    cfg: DictConfig
    run_dir: Path

    @property
    def group(self) -> str:
        """Jobs with the same key share one worker group (same P, cluster, backend)."""
        return json.dumps(
            [
                self.cfg.nodes,
                resolve_backend(self.cfg),
                self.cfg.get("threads_per_worker"),
                OmegaConf.to_container(self.cfg.cluster, resolve=True),
            ],
            sort_keys=True,
        )


def expand(overrides: list[str]) -> list[list[str]]:
    """Every combination of the sweep overrides (``k=a,b``), like Hydra's basic sweeper:
    later keys vary fastest."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for text, o in zip(overrides, parsed):
        if o.is_sweep_override():
            key = o.get_key_element()
            choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([text])
    return [list(c) for c in itertools.product(*choices)]


def compose_job(overrides: list[str], conf_dir: Path = CONF) -> Job:
    """The job ``run.py -m`` would run for these (non-sweep) overrides."""
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        full = compose("config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(full)
        job = OmegaConf.to_container(OmegaConf.create({k: v for k, v in full.items() if k != "hydra"}), resolve=True)
        run_dir = Path(full.hydra.sweep.dir) / full.hydra.job.override_dirname
    return Job(OmegaConf.create(job), run_dir)


def plan(overrides: list[str], conf_dir: Path = CONF) -> tuple[list[Job], list[Job]]:
    """(jobs to run, jobs already finished); raises ConfigError on the first bad job."""
    todo, done = [], []
    for ov in expand(overrides):
        job = compose_job(ov, conf_dir)
        if job.cfg.mode != "benchmark":
            raise ConfigError(f"mode={job.cfg.mode}: gtopk.run.batch runs benchmarks only; use run.py for training")
        if (job.run_dir / SUMMARY).exists():
            done.append(job)
            continue
        validate(job.cfg)
        try:
            with open_dict(job.cfg):
                job.cfg.compute.update(instantiate(job.cfg.compute).resolve(job.cfg))
        except ProfileError as e:
            raise ConfigError(str(e)) from None
        todo.append(job)
    return todo, done


def run_jobs(rank: int, world: int, jobs: list[tuple[dict, str]]) -> list[dict] | None:
    """Worker entry point: the group's jobs one after another (collective). A job config's
    ``threads_per_worker`` (when set) replaces the launcher's intra-op thread count."""
    threads = jobs[0][0].get("threads_per_worker") if jobs else None
    if threads:
        torch.set_num_threads(int(threads))
    summaries = []
    for i, (cfg_dict, run_dir) in enumerate(jobs):
        if rank == 0:
            print(f"  [{i + 1}/{len(jobs)}] {run_dir}", flush=True)
        summary = run_worker(rank, world, cfg_dict, run_dir)
        if rank == 0:
            summaries.append(summary)
            print(
                f"  done: {summary['images_per_s_per_worker']:.1f} images/s per worker, "
                f"t_iter {summary['t_iter']:.3f}s",
                flush=True,
            )
    return summaries if rank == 0 else None


def run_group(jobs: list[Job]) -> None:
    """Run ``jobs`` (one group key) in one set of P workers on their cluster."""
    first = jobs[0].cfg
    for job in jobs:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(job.cfg, job.run_dir / "config.yaml", resolve=True)
    payload = [(OmegaConf.to_container(j.cfg, resolve=True), str(j.run_dir)) for j in jobs]
    timeout = float(first.timeout_s) * len(jobs)  # the watchdog bounds start-up too
    with instantiate(first.cluster).up(first.nodes) as placement:
        spawn(
            run_jobs,
            first.nodes,
            (payload,),
            backend=resolve_backend(first),
            timeout=timeout,
            collective_timeout=first.get("collective_timeout_s"),
            placement=placement,
            port=first.get("master_port", 0),
        )


def main(argv: list[str] | None = None) -> int:
    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        todo, done = plan(overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    groups: dict[str, list[Job]] = {}
    for job in todo:
        groups.setdefault(job.group, []).append(job)
    print(
        f"gtopk.run.batch: {len(todo)} jobs to run in {len(groups)} worker groups, {len(done)} finished before",
        flush=True,
    )
    failed: list[str] = []
    for key, jobs in sorted(groups.items(), key=lambda kv: (kv[1][0].cfg.nodes, kv[0])):
        cfg = jobs[0].cfg
        print(f"P={cfg.nodes} on cluster={cfg.cluster_name}: {len(jobs)} jobs", flush=True)
        t0 = time.monotonic()
        try:
            run_group(jobs)
        except WorkerError as e:
            print(
                f"error: a job of this group failed; {e.summary() if hasattr(e, 'summary') else e}",
                file=sys.stderr,
                flush=True,
            )
            failed += [str(j.run_dir) for j in jobs if not (j.run_dir / SUMMARY).exists()]
        print(f"P={cfg.nodes}: {time.monotonic() - t0:.0f} s", flush=True)
    if failed:
        print("unfinished jobs (re-run the same command to retry them):\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
