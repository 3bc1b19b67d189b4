"""Hydra's submitit SLURM launcher (``hydra/launcher=submitit_slurm``, conf/hydra/launcher/)
with the sweep semantics of the basic launcher. submitit submits the jobs (one SLURM array)
and runs each one in its SLURM job; this subclass adds, in the submitting process:

* a job whose run directory is finished with the same settings (its config's fingerprint,
  ``gtopk.records.identity``) is not submitted: it is listed as skipped, as the basic
  launcher's job does (``gtopk.run.execute``), so re-running a sweep resumes it; one whose
  folder holds a result of other settings is not submitted either (without ``rerun=true``)
  and is listed as failed with the one line that names the settings that differ;
* every job is waited for, and the ones that did not finish (``failed.json``'s one-line
  error, or the SLURM job's own end) are handed to ``gtopk.run.jobs.FailedJobs``, which
  lists them at the end of the sweep and exits 1, as for a local sweep.

In the SLURM job a failed job exits non-zero (``gtopk.run.jobs.job_failed``): its
``SystemExit`` becomes a ``JobExit`` error, which submitit records in the job's result file
before the job ends (FAILED in SLURM); a clean exit is not an error submitit sees, and
without accounting (``sacct``) the submitting process would wait for a result forever.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf, open_dict

from gtopk.records.identity import Verdict
from gtopk.records.rundir import FAILED
from gtopk.run.jobs import Failure, ran_elsewhere

log = logging.getLogger(__name__)
#: the name conf/hydra/launcher/submitit_slurm.yaml gives this launcher: Hydra instantiates
#: launchers only from its plugin registry, under names in the ``hydra_plugins`` namespace
PLUGIN_NAME = "hydra_plugins.gtopk.SweepSlurmLauncher"


class JobExit(RuntimeError):
    """A job that ended with a non-zero exit status (its error is already on stderr)."""

    def __init__(self, code: int | str | None):
        super().__init__(f"the job exited with status {code}")
        self.code = code


class SweepSlurmLauncher(SlurmLauncher):
    """``SlurmLauncher`` that skips finished jobs and lists the failed ones (see module)."""

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        """Runs in the SLURM job: the Hydra job; a non-zero exit becomes ``JobExit``."""
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as e:
            if e.code in (0, None):
                raise
            raise JobExit(e.code) from None

    def run_dir(self, overrides: Sequence[str]) -> Path:
        """The run directory of the job with ``overrides`` (as the job will compute it)."""
        return self._job(overrides)[0]

    def _job(self, overrides: Sequence[str]) -> tuple[Path, Any]:
        """(run directory, the job's config as its task function will see it)."""
        assert self.hydra_context is not None and self.config is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        HydraConfig.instance().set_config(cfg)  # ${hydra:runtime.choices.*} resolve as in the job
        task = copy.deepcopy(cfg)
        with open_dict(task):
            del task["hydra"]
        return run_dir, task

    def _verdict(self, overrides: Sequence[str]) -> tuple[Path, Verdict]:
        """What the job's run directory holds for it (``gtopk.run.execute.decide``'s read-only part)."""
        from gtopk.run.execute import OtherSettings, decide, job_identity

        run_dir, task = self._job(overrides)
        try:
            return run_dir, decide(run_dir, job_identity(task), task)
        except OtherSettings as e:
            return run_dir, Verdict("refuse", str(e))
        except Exception:  # noqa: BLE001 - bad input: the job itself reports it in its one line
            return run_dir, Verdict("run")

    def _executor(self) -> Any:
        """submitit's executor with this launcher's parameters (as the plugin builds it)."""
        import submitit

        init_keys = {"max_num_timeout", "submitit_folder"}
        init = {"folder": self.params["submitit_folder"]}
        if "max_num_timeout" in self.params:
            init[f"{self._EXECUTOR}_max_num_timeout"] = self.params["max_num_timeout"]
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{k if k in base else f"{self._EXECUTOR}_{k}": v for k, v in self.params.items() if k not in init_keys}
        )
        return executor

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Collective of nothing: submit the unfinished jobs as one SLURM array, wait for
        all of them, return their results in order (None for a failed job, listed at the end
        of the sweep by ``FailedJobs``)."""
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        n = len(job_overrides)
        returns: dict[int, JobReturn] = {}
        pending, refused = [], []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            run_dir, v = self._verdict(overrides)
            if v.action == "skip":
                print(f"job {idx + 1} of {n}: skipping {run_dir}: finished with these settings", flush=True)
                returns[idx] = _finished(overrides, run_dir, v.value)
            elif v.action == "refuse":
                print(f"job {idx + 1} of {n}: not submitted: {v.why}", file=sys.stderr, flush=True)
                refused.append(Failure(str(run_dir), v.why, None))
                returns[idx] = _finished(overrides, run_dir, None)
            else:
                pending.append((idx, list(overrides), run_dir))
        failures = refused
        if pending:
            state = Singleton.get_state()
            params = [(o, "hydra.sweep.dir", idx, f"job_id_for_{idx}", state) for idx, o, _ in pending]
            jobs = self._executor().map_array(self, *zip(*params))
            for (idx, overrides, _), job in zip(pending, jobs):
                print(
                    f"job {idx + 1} of {n}: SLURM job {job.job_id}: {' '.join(filter_overrides(overrides))}", flush=True
                )
            for (idx, overrides, run_dir), job in zip(pending, jobs):
                ret, error = _outcome(job)
                if error is not None:
                    failures.append(self._failure(run_dir, job, error))
                    ret = _finished(overrides, run_dir, None)
                returns[idx] = ret
        ran_elsewhere(n, failures)
        return [returns[idx] for idx in sorted(returns)]

    def _failure(self, run_dir: Path, job: Any, error: str) -> Failure:
        """What the sweep lists for a job that did not finish: the one-line error the job
        recorded (``failed.json``), else the SLURM job's; its Hydra log and SLURM output."""
        try:
            error = json.loads((run_dir / FAILED).read_text())["error"]
        except (OSError, ValueError, KeyError):
            pass
        assert self.config is not None
        logs = [p for p in (run_dir / f"{self.config.hydra.job.name}.log", Path(job.paths.stderr)) if p.exists()]
        return Failure(str(run_dir), f"SLURM job {job.job_id}: {error}", ", ".join(map(str, logs)) or None)


def _outcome(job: Any) -> tuple[JobReturn | None, str | None]:
    """The job's ``JobReturn`` and None, or None and a one-line error."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        ret = job.results()[0]
    except (FailedJobError, UncompletedJobError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return None, next((ln for ln in reversed(lines) if "Error" in ln or "Exit" in ln), lines[-1] if lines else "?")
    if ret.status == JobStatus.FAILED:  # an exception that escaped the task function
        return None, f"{type(ret._return_value).__name__}: {ret._return_value}".splitlines()[0]
    return ret, None


def _finished(overrides: Sequence[str], run_dir: Path, value: float | None) -> JobReturn:
    """A job's return as the basic launcher gives it: COMPLETED, images/s or None."""
    return JobReturn(
        overrides=list(overrides), working_dir=str(run_dir), status=JobStatus.COMPLETED, _return_value=value
    )


def register() -> None:
    """Add ``SweepSlurmLauncher`` to Hydra's plugin registry as ``PLUGIN_NAME`` (run.py
    calls it before Hydra starts; a package of its own under ``hydra_plugins`` would be a
    new top-level folder)."""
    Plugins.instance().class_name_to_class[PLUGIN_NAME] = SweepSlurmLauncher
