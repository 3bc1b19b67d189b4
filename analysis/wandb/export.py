"""Records on disk -> wandb: ``python -m analysis.wandb.export [RUNS...]`` (``make wandb-export``).

The run directories stay the source of truth; wandb is a view of them, written here, in
the exporting process (never inside a timed job). Every finished job (``summary.json``)
under RUNS becomes one wandb run:

* id: a hash of the job directory's absolute path, so exporting again resumes and updates
  the same run (``resume="allow"``: config and summary replaced; online, history steps the
  server has are not sent again); moving the directory makes it another run;
* group = experiment name (``name``), job_type = reducer, name ``<reducer>-<model>-p<P>-d<rho>``;
* config: flat keys to group and filter by (``flat_config``), the job's environment
  (``env``: summary.json's) and its whole resolved config (``resolved``);
* history: one row per iteration with ``iteration`` as its step, each value the median
  over the ranks' rows of that iteration (``t_commu_last_arrival``: the minimum, as in the
  summary; ``warmup``: any rank's; ``nonfinite``: the action a rank took), the latest
  attempt of an iteration counting; a training job's epoch metrics (``epochs.jsonl``)
  join the last row of their epoch, with ``epoch`` as their own step metric;
* summary: summary.json (``env`` goes to config).

Jobs still running (their lock held), failed (``failed.json``) or never finished are
skipped, one line each. Then every ``analysis/`` folder under RUNS becomes one analysis
run of its experiment (``analysis.wandb.analyses``).

Mode: ``WANDB_MODE`` when set, else online when logged in (``wandb login`` or
``WANDB_API_KEY``), else offline. Offline runs go to ``$WANDB_DIR/wandb/`` (default
``runs/wandb-export``), one folder per run id (an older export of the same run is
replaced); upload them with ``make wandb-sync``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.wandb.online import wandb_mode
from analysis.wandb.runs import default_project, init_run, run_id
from gtopk.records.rundir import FAILED, LOCK, SUMMARY, RunDir, read_jsonl, run_dirs

DEFAULT_DIR = Path("runs") / "wandb-export"
#: per-iteration fields that are not measurements
ROW_IDS = {"rank", "iter", "attempt", "epoch"}
EPOCH_METRICS_STEP = "epoch"


def lock_holder(run_dir: Path) -> int | None:
    """Pid holding ``run_dir``'s job lock (from /proc/locks: looking never takes the
    lock, so a job starting meanwhile is not turned away), None when free."""
    try:
        st = RunDir(run_dir).lock.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    me = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        f = line.split()
        if len(f) > 5 and f[1] == "FLOCK" and f[5] == me:
            return int(f[4])
    return None


@dataclass
class Job:
    """A finished job's records."""

    run_dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]


def finished_jobs(roots: list[Path]) -> tuple[list[Job], list[str]]:
    """(finished jobs, one line per skipped job) under ``roots``."""
    jobs, skipped = [], []
    for run in run_dirs(roots):
        d = run.path
        if run.is_finished:
            jobs.append(Job(d, run.read_config(), run.read_summary()))
        elif (pid := lock_holder(d)) is not None:
            skipped.append(f"skipping {d}: still running (pid {pid} holds {LOCK})")
        elif run.has_failed:
            err = json.loads(run.failed.read_text()).get("error", "?")
            skipped.append(f"skipping {d}: failed ({FAILED}: {err})")
        else:
            skipped.append(f"skipping {d}: not finished (no {SUMMARY}: running elsewhere, or interrupted)")
    return jobs, skipped


def flat_config(cfg: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """Keys to group and filter runs by: what the job ran (config.yaml), where (cluster
    and its bandwidth, compute and its profile) and at which commit (summary.json env)."""
    reducer = dict(cfg.get("reducer") or {})
    cluster = dict(cfg.get("cluster") or {})
    out: dict[str, Any] = {
        "experiment": cfg.get("name"),
        "reducer": cfg.get("reducer_name", summary.get("reducer")),
        "reducer_class": reducer.pop("_target_", None),
        "model": cfg.get("model_name", summary.get("model")),
        "data": cfg.get("data_name", summary.get("data")),
        "mode": cfg.get("mode"),
        "nodes": cfg.get("nodes"),
        "density": cfg.get("density"),
        "batch_per_worker": cfg.get("batch_size"),
        "grad_accum": cfg.get("grad_accum"),
        "params": summary.get("params"),
        "cluster": cfg.get("cluster_name", summary.get("cluster")),
        "bandwidth": cluster.get("bandwidth", summary.get("bandwidth")),
        "bandwidth_bits_per_s": summary.get("bandwidth_bits_per_s"),
        "cluster_latency": cluster.get("latency"),
        "compute": cfg.get("compute_name", summary.get("compute")),
        "compute_profile": summary.get("compute_profile", (cfg.get("compute") or {}).get("profile")),
        "t_compute_replayed": summary.get("t_compute_replayed"),
        "seed": cfg.get("seed"),
        "device": summary.get("device"),
        "backend": summary.get("backend"),
        "git_commit": (summary.get("env") or {}).get("git_commit"),
        "host": (summary.get("env") or {}).get("host"),
    }
    for key, value in reducer.items():  # the reducer's own settings: putback, algorithm, ...
        out.setdefault(key, value)
    return out


def history(run_dir: Path) -> list[dict[str, Any]]:
    """One row per iteration: the median over ranks of each measurement (see the module
    docstring), the latest attempt of each iteration, epoch metrics on their epoch's last row."""
    per_iter: dict[int, list[dict]] = {}
    for path in RunDir(run_dir).all_iters():
        latest = {r["iter"]: r for r in read_jsonl(path) if "iter" in r}  # later lines: later attempts
        for it, row in latest.items():
            per_iter.setdefault(it, []).append(row)
    rows = []
    for it in sorted(per_iter):
        ranks = per_iter[it]
        row: dict[str, Any] = {"iteration": it, "ranks": len(ranks), "attempt": max(r.get("attempt", 1) for r in ranks)}
        if "epoch" in ranks[0]:
            row["epoch"] = ranks[0]["epoch"]
        for key in ranks[0].keys() - ROW_IDS:
            values = [r.get(key) for r in ranks]
            if all(isinstance(v, bool) for v in values):  # warmup: true when any rank's is
                row[key] = any(values)
            elif all(isinstance(v, (int, float)) for v in values):
                row[key] = statistics.median(values)
            elif any(isinstance(v, str) and v for v in values):  # nonfinite: the action taken
                row[key] = next(v for v in values if isinstance(v, str) and v)
        if "t_commu" in row:
            row["t_commu_last_arrival"] = min(r["t_commu"] for r in ranks)
        rows.append(row)
    last_of_epoch = {r["epoch"]: r for r in rows if "epoch" in r}
    for metrics in read_jsonl(RunDir(run_dir).epochs):
        target = last_of_epoch.get(metrics.get("epoch"))
        if target is None:
            print(f"warning: {run_dir}: epoch {metrics.get('epoch')} has no iteration rows; not exported")
            continue
        target.update(metrics)
    return rows


def export_job(job: Job, mode: str, wandb_dir: Path, project: str | None, entity: str | None) -> str:
    """One finished job -> one wandb run (see the module docstring); returns its id."""
    cfg, summary = job.config, job.summary
    flat = flat_config(cfg, summary)
    rid = run_id(job.run_dir)
    run = init_run(
        rid,
        mode,
        wandb_dir,
        project or (cfg.get("logger") or {}).get("project") or default_project(),
        entity,
        group=flat["experiment"],
        job_type=flat["reducer"],
        name=f"{flat['reducer']}-{flat['model']}-p{flat['nodes']}-d{flat['density']}",
        tags=[f"{k}:{flat[k]}" for k in ("reducer", "model", "nodes", "density", "mode", "cluster", "compute")],
        config={
            **flat,
            "run_dir": str(job.run_dir.resolve()),
            "env": summary.get("env") or {},
            "resolved": cfg,
        },
    )
    run.define_metric("iteration")
    run.define_metric("*", step_metric="iteration")
    run.define_metric(EPOCH_METRICS_STEP)
    for key in ("train_loss", "test_loss", "test_top1"):
        run.define_metric(key, step_metric=EPOCH_METRICS_STEP)
    for row in history(job.run_dir):
        if row["iteration"] >= run.starting_step:  # online, a resumed run has the earlier steps already
            run.log(row, step=row["iteration"], commit=True)  # flushed before the summary below
    run.summary.update({k: v for k, v in summary.items() if k != "env"})
    run.finish()
    return rid


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*", default=["runs"], help="folders holding run directories (default runs)")
    ap.add_argument("--project", default=os.environ.get("WANDB_PROJECT"), help="default: the jobs' logger.project")
    ap.add_argument("--entity", default=os.environ.get("WANDB_ENTITY"))
    ap.add_argument("--no-analysis", action="store_true", help="jobs only, no analysis runs")
    args = ap.parse_args(argv)
    roots = [Path(r) for r in args.roots]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        raise SystemExit(
            f"error: RUNS folder(s) {' '.join(missing)} do not exist; pass RUNS=<folders with run directories>"
        )
    mode = wandb_mode()
    wandb_dir = Path(os.environ.get("WANDB_DIR") or DEFAULT_DIR)
    jobs, skipped = finished_jobs(roots)
    for line in skipped:
        print(line)
    for job in jobs:
        rid = export_job(job, mode, wandb_dir, args.project, args.entity)
        print(f"exported {job.run_dir} -> run {rid}")
    n_analysis = 0
    if not args.no_analysis:
        from analysis.wandb.analyses import export_analyses

        n_analysis = export_analyses(roots, jobs, mode, wandb_dir, args.project, args.entity)
    if jobs or n_analysis:
        import wandb

        wandb.teardown()  # waits for wandb's service to write every run's files (finish() may return first)
    where = f"{wandb_dir / 'wandb'}/offline-run-* (upload: make wandb-sync)" if mode == "offline" else "wandb"
    print(
        f"{len(jobs)} job run(s) and {n_analysis} analysis run(s) exported ({mode}) to {where}; {len(skipped)} skipped"
    )
    if not jobs and not n_analysis:
        raise SystemExit(f"error: no finished job or analysis folder under {' '.join(map(str, roots))}")


if __name__ == "__main__":
    main()
