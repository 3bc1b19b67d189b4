"""gtopk.run.batch composes jobs as run.py -m would (no processes started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gtopk.run.batch import compose_job, expand, plan
from gtopk.run.job import ConfigError


def test_expand_is_the_cartesian_product_of_sweeps():
    assert expand(["model=a,b", "nodes=1,2", "name=x"]) == [
        ["model=a", "nodes=1", "name=x"],
        ["model=a", "nodes=2", "name=x"],
        ["model=b", "nodes=1", "name=x"],
        ["model=b", "nodes=2", "name=x"],
    ]


def test_compose_job_matches_run_py_sweep_directory_and_config():
    job = compose_job(["experiment=fig6_reproduce", "reducer=gtopk", "nodes=4", "logger.wandb=false"])
    assert job.run_dir == Path("runs/fig6_reproduce/experiment=fig6_reproduce,nodes=4,reducer=gtopk")
    assert job.cfg.reducer_name == "gtopk" and job.cfg.cluster_name == "emulated"
    assert job.cfg.compute._target_.endswith("ReplayedCompute") and job.cfg.batch_size == 128
    assert job.cfg.threads_per_worker == 1


def test_plan_skips_finished_jobs_and_rejects_training(tmp_path):
    base = ["experiment=quick", "cluster=local", f"hydra.sweep.dir={tmp_path}"]
    done = tmp_path / "cluster=local,experiment=quick,nodes=1,reducer=dense"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    todo, finished = plan(base + ["reducer=dense,gtopk", "nodes=1"])
    assert [j.run_dir for j in finished] == [done]
    assert [j.cfg.reducer_name for j in todo] == ["gtopk"]
    with pytest.raises(ConfigError, match="benchmarks only"):
        plan(base + ["mode=train"])
