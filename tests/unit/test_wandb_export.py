"""``analysis.wandb.export`` offline: jobs written in the real formats become wandb runs
whose offline files, read back (``analysis.wandb.datastore``), hold the records' config,
per-iteration rows, summary, environment and the analysis folder's tables and figures."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pandas as pd
import pytest

from analysis.wandb.datastore import WandbFileError, read_run
from gtopk.run.jobs import job_lock
from tests.wandb_records import BENCH, ENV, FIG6, PAYOFF, SUMMARY, TABLE4, export, make_runs, offline_runs, write_job


@pytest.fixture
def exported(tmp_path, capsys):
    jobs = make_runs(tmp_path / "runs")
    with job_lock(jobs["running"]):  # the real job lock, held as a running job holds it
        out = export(tmp_path / "runs", tmp_path / "wandb-out", capsys)
    runs = offline_runs(tmp_path / "wandb-out")
    by_dir = {r.config.get("run_dir") or r.config.get("analysis_dir"): r for r in runs.values()}
    return jobs, runs, {k: by_dir[str(v.resolve())] for k, v in jobs.items() if str(v.resolve()) in by_dir}, out


def test_benchmark_job_run_holds_config_history_summary_env(exported):
    jobs, runs, by_job, _ = exported
    run = by_job["bench"]
    assert (run.group, run.job_type, run.name) == ("expA", "gtopk", "gtopk-resnet20-p3-d0.001")
    c = run.config
    assert (c["experiment"], c["reducer"], c["model"], c["nodes"], c["density"]) == (
        "expA",
        "gtopk",
        "resnet20",
        3,
        0.001,
    )
    assert (c["cluster"], c["bandwidth"], c["bandwidth_bits_per_s"]) == ("emulated", "1gbit", 1e9)
    assert (c["compute"], c["compute_profile"]) == ("replay", "p102")
    assert (c["algorithm"], c["putback"], c["reducer_class"]) == (
        "recursive_doubling",
        "exact",
        "gtopk.reducers.GTopKReducer",
    )
    assert c["git_commit"] == ENV["git_commit"] and c["env"] == ENV
    assert c["resolved"]["reducer"]["algorithm"] == "recursive_doubling"
    # one row per iteration, step = iteration; medians over ranks, rank 0's latest attempt
    assert run.metrics["*"] == "iteration"
    assert [h["_step"] for h in run.history] == [h["iteration"] for h in run.history] == [0, 1, 2]
    assert [h["t_iter"] for h in run.history] == pytest.approx([0.6, 0.3, 0.25])
    assert [h["t_commu_last_arrival"] for h in run.history] == pytest.approx([0.125, 0.05, 0.0375])
    assert [h["bytes_sent"] for h in run.history] == [2000, 2000, 2000]
    assert [h["warmup"] for h in run.history] == [True, False, False]
    assert [h["attempt"] for h in run.history] == [1, 2, 1] and {h["ranks"] for h in run.history} == {3}
    for key, value in SUMMARY.items():
        assert run.summary[key] == value, key
    assert "env" not in run.summary and run.exit_code == 0


def test_training_job_epoch_metrics_join_the_last_row_of_their_epoch(exported):
    run = exported[2]["train"]
    assert run.config["mode"] == "train" and run.job_type == "dense"
    assert run.metrics["train_loss"] == run.metrics["test_top1"] == "epoch"
    with_epoch = [
        (h["iteration"], h["epoch"], h["train_loss"], h["test_top1"]) for h in run.history if "train_loss" in h
    ]
    assert with_epoch == [(1, 0, 2.3, 0.11), (3, 1, 1.9, 0.27)]
    assert [h["epoch"] for h in run.history] == [0, 0, 1, 1]


def test_unfinished_jobs_are_skipped_with_one_line_each(exported):
    jobs, runs, by_job, out = exported
    assert set(by_job) == {"bench", "train"}
    assert len(runs) == 3  # two jobs, one analysis run
    lines = {
        name: [ln for ln in out.splitlines() if str(jobs[name]) in ln] for name in ("running", "failed", "interrupted")
    }
    assert len(lines["running"]) == 1 and "still running" in lines["running"][0]
    assert len(lines["failed"]) == 1 and "WorkerError: rank 1 died" in lines["failed"][0]
    assert len(lines["interrupted"]) == 1 and "not finished" in lines["interrupted"][0]


def png_size(path: Path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_analysis_run_holds_tables_figures_commit_and_network(exported, tmp_path):
    runs = exported[1]
    (run,) = [r for r in runs.values() if r.job_type == "analysis"]
    assert run.group == "expA" and run.config["jobs"] == 1  # expA's one finished job
    assert f"commit:{ENV['git_commit'][:12]}" in run.tags and "network:emulated_bandwidth-1gbit" in run.tags
    net = run.config["network"]["emulated_bandwidth-1gbit"]
    assert (net["alpha"], net["beta"], net["bits_per_s"]) == (2e-4, 8e-9, pytest.approx(1e9))
    for key, table in (("table/fig6", FIG6), ("table/table4", TABLE4), ("table/payoff", PAYOFF)):
        assert run.table(key) == table
    png = tmp_path / "runs" / "expA" / "analysis" / "fig6.png"
    assert run.summary["figure/fig6"]["_type"] == "image-file"
    assert png_size(run.file("figure/fig6")) == png_size(png)
    assert (run.summary["figure/fig6"]["width"], run.summary["figure/fig6"]["height"]) == png_size(png)


def test_exporting_twice_updates_the_same_runs(exported, tmp_path, capsys):
    jobs, first, _, _ = exported
    write_job(jobs["interrupted"], BENCH, {}, SUMMARY)  # it finished meanwhile
    export(tmp_path / "runs", tmp_path / "wandb-out", capsys)
    again = offline_runs(tmp_path / "wandb-out")  # asserts one copy per run id
    assert set(first) < set(again) and len(again) == len(first) + 1
    for rid, run in first.items():
        assert again[rid].config.get("run_dir") == run.config.get("run_dir")


def test_reader_joins_records_split_across_blocks_and_checks_crcs(tmp_path):
    import wandb

    big = "x" * 100_000  # a config record spanning four 32 KiB blocks
    run = wandb.init(mode="offline", dir=str(tmp_path), project="t", config={"big": big, "n": 7})
    for i in range(2000):
        run.log({"i": i})
    run.finish()
    wandb.teardown()  # the service writes the file; finish() can return first
    (path,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    back = read_run(path)
    assert back.config["big"] == big and back.config["n"] == 7
    assert [h["i"] for h in back.history] == list(range(2000))
    data = bytearray(path.read_bytes())
    data[40_000] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(WandbFileError, match="checksum"):
        read_run(path)


def test_summary_values_come_from_summary_json_not_history(exported):
    run = exported[2]["bench"]
    assert run.summary["t_iter"] == json.loads((exported[0]["bench"] / "summary.json").read_text())["t_iter"] == 0.275


def test_analysis_scripts_read_exported_runs_as_the_local_jobs_and_count_them_once(exported, tmp_path):
    from types import SimpleNamespace

    from analysis.load import _merge, load_epochs, load_jobs, wandb_rows

    def api_run(run):  # what wandb.Api().runs gives, for an exported run read back from its file
        def history(keys, pandas=False):
            return [{k: h[k] for k in keys} for h in run.history if all(k in h for k in keys)]

        return SimpleNamespace(
            id=run.run_id, path=["team", "gtopk", run.run_id], config=run.config, summary=run.summary, history=history
        )

    remote_jobs, remote_epochs = (pd.DataFrame(rows) for rows in wandb_rows(api_run(r) for r in exported[1].values()))
    local_jobs, local_epochs = load_jobs([tmp_path / "runs"]), load_epochs([tmp_path / "runs"])
    cols = ["name", "reducer", "model", "nodes", "t_iter", "images_per_s_per_worker"]
    key = ["name", "reducer"]
    assert remote_jobs[cols].sort_values(key).values.tolist() == local_jobs[cols].sort_values(key).values.tolist()
    ecols = ["name", "reducer", "epoch", "train_loss", "test_top1"]
    assert remote_epochs[ecols].values.tolist() == local_epochs[ecols].values.tolist()
    assert len(_merge(local_jobs, remote_jobs)) == len(local_jobs) == 2
    assert len(_merge(local_epochs, remote_epochs)) == len(local_epochs) == 2
