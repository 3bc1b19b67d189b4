"""Run directories written by hand in the real formats (the writers run.py uses: the
composed config saved resolved, ``JsonLines`` rows, an atomic ``summary.json``), and the
offline wandb runs an export leaves, read back from their ``.wandb`` files."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from analysis.wandb.datastore import OfflineRun, read_run
from gtopk.perf.netprofile import NetworkProfile
from gtopk.records.rundir import JsonLines, write_json_atomic
from tests.config import compose_config

ENV = {"git_commit": "0123456789abcdef0123456789abcdef01234567", "host": "box", "torch": "2.14.1", "cpu": "AMD EPYC"}


def timing_row(rank: int, it: int, t_iter: float, warmup: bool = False, attempt: int = 1, **extra: Any) -> dict:
    """One ``iters.rank<r>.jsonl`` line as the training loop writes it."""
    row = {
        "t_data": 0.001,
        "t_compute": t_iter / 2,
        "t_compr": 0.002,
        "t_commu": t_iter / 4,
        "t_merge": 0.0,
        "t_update": 0.003,
        "t_iter": t_iter,
        "t_check": 0.0005,
        "nonfinite_ranks": [],
        "nonfinite": None,
        "loss": 2.0 + rank,
        "lr": 0.1,
        "density": 0.001,
        "bytes_sent": 1000 * (rank + 1),
        "bytes_recv": 2000,
        "messages_sent": 1,
        "selected": 270,
        "rank": rank,
        "iter": it,
        "warmup": warmup,
        "attempt": attempt,
    }
    row.update(extra)
    return row


def write_job(
    run_dir: Path,
    overrides: list[str],
    rows: dict[int, list[dict]],
    summary: dict | None = None,
    epochs: list[dict] | None = None,
) -> dict:
    """A job directory: config.yaml (``overrides`` composed), rows per rank, epochs, and
    (unless ``summary`` is None) summary.json with ``env``. Returns the resolved config."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = compose_config(overrides)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    for rank, lines in rows.items():
        f = JsonLines(run_dir / f"iters.rank{rank}.jsonl")
        for line in lines:
            f.write(line)
        f.close()
    if epochs:
        f = JsonLines(run_dir / "epochs.jsonl")
        for e in epochs:
            f.write(e)
        f.close()
    if summary is not None:
        write_json_atomic(run_dir / "summary.json", {**summary, "env": ENV})
    return OmegaConf.to_container(cfg, resolve=True)


def offline_runs(wandb_dir: Path) -> dict[str, OfflineRun]:
    """Every offline run under ``wandb_dir``/wandb, by run id (read from its .wandb file)."""
    runs = {}
    for path in sorted((wandb_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        run = read_run(path)
        assert run.run_id not in runs, f"two offline copies of run {run.run_id}"
        runs[run.run_id] = run
    return runs


BENCH = ["name=expA", "reducer=gtopk", "nodes=3", "density=0.001", "cluster=emulated", "compute=replay"]
BENCH += ["reducer.algorithm=recursive_doubling", "reducer.putback=exact"]
TRAIN = ["name=conv", "reducer=dense", "nodes=2", "mode=train", "data=cifar10"]
# t_iter per (iteration, rank); rank 0 re-ran iteration 1 (attempt 2: 0.2 s, attempt 1: 9.9 s)
T = {0: (0.5, 0.7, 0.6), 1: (0.2, 0.4, 0.3), 2: (0.25, 0.35, 0.15)}
SUMMARY = {
    "reducer": "gtopk",
    "model": "resnet20",
    "nodes": 3,
    "density": 0.001,
    "t_iter": 0.275,
    "images_per_s_per_worker": 465.5,
    "cluster": "emulated",
    "bandwidth": "1gbit",
    "bandwidth_bits_per_s": 1e9,
    "compute": "replay",
    "compute_profile": "p102",
    "iterations": 6,
    "batch_per_worker": 16,
    "grad_accum_steps": 1,
}
# (columns, rows) of the analysis CSVs; None: an empty cell
FIG6 = (
    ["name", "model", "reducer", "nodes", "efficiency", "kind"],
    [["expA", "resnet20", "gtopk", 1, 1.0, "measured"], ["expA", "resnet20", "gtopk", 3, 0.8, "measured"]],
)
TABLE4 = (["model", "nodes", "kind", "e_gtopk", "gtopk/dense"], [["resnet20", 3, "measured", 0.8, None]])
# two rows of a payoff.csv (its header as analysis.payoff writes it): gTop-k and DDP at one cell
PAYOFF = (
    [
        "model", "data", "batch_per_worker", "grad_accum", "density", "nodes", "network", "compute_profile",
        "target", "reducer", "status", "iterations_to_target", "t_iter", "time_to_target", "speedup_vs_ddp",
        "speedup_vs_ddp_fp16", "speedup_vs_powersgd", "bandwidth_gbps", "calibrated", "target_acc", "iterations_from_nodes", "borrowed", "iterations_source",
        "iterations_detail", "t_iter_source", "t_iter_detail", "time_source", "seeds", "iterations_per_seed",
        "iterations_min", "iterations_max", "time_min", "time_max", "coverage", "still_rising", "reducer_density",
        "picked",
    ],
    [
        [
            "resnet20", "digits", 32, 1, 0.001, 4, "emulated (0.955 Gbit/s)", "p102", "99 % of dense", "gtopk", "reached",
            396, 0.052, 20.592, 1.202, None, None, 0.955, True, 0.973, 4, False, "measured",
            "training run, P=4: 1/1 runs reached it", "measured", "benchmark job", "measured", 1, "seed 0: 396",
            396, 396, 20.592, 20.592, 0.55, False, 0.001, True,
        ],
        [
            "resnet20", "digits", 32, 1, 0.001, 4, "emulated (0.955 Gbit/s)", "p102", "99 % of dense", "ddp", "reached",
            165, 0.15, 24.75, 1.0, None, None, 0.955, True, 0.973, 4, False, "measured",
            "dense training run (same update), P=4: 1/1 runs reached it", "modelled",
            "t_compute p102, overheads benchmark P=1", "modelled", 1, "seed 0: 165", 165, 165, 24.75, 24.75,
            165.0, False, None, True,
        ],
    ],
)  # fmt: skip


def write_csv(path: Path, table: tuple[list, list]) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([table[0], *table[1]])


def make_runs(root: Path) -> dict[str, Path]:
    """expA: a finished 3-rank benchmark, its analysis folder and network profile; conv: a
    finished 2-rank training job; and three jobs that did not finish."""
    jobs = {"bench": root / "expA" / "gtopk-p3", "train": root / "conv" / "dense-p2"}
    rows = {r: [timing_row(r, it, T[it][r], warmup=it == 0) for it in T] for r in range(3)}
    rows[0][1:2] = [timing_row(0, 1, 9.9), timing_row(0, 1, T[1][0], attempt=2)]  # attempts 1 and 2
    write_job(jobs["bench"], BENCH, rows, SUMMARY)
    train_rows = {r: [timing_row(r, it, 0.1 * (it + 1), epoch=it // 2) for it in range(4)] for r in range(2)}
    epochs = [{"epoch": 0, "train_loss": 2.3, "test_loss": 2.2, "test_top1": 0.11}]
    epochs.append({"epoch": 1, "train_loss": 1.9, "test_loss": 2.0, "test_top1": 0.27})
    write_job(jobs["train"], TRAIN, train_rows, {**SUMMARY, "mode": "train", "reducer": "dense"}, epochs)
    for name in ("running", "failed", "interrupted"):
        jobs[name] = root / "expA" / name
        write_job(jobs[name], BENCH, {0: [timing_row(0, 0, 0.5, warmup=True)]})
    write_json_atomic(jobs["failed"] / "failed.json", {"error": "WorkerError: rank 1 died", "type": "WorkerError"})
    analysis = root / "expA" / "analysis"
    analysis.mkdir()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([1, 3], [1.0, 0.8])
    fig.savefig(analysis / "fig6.png", dpi=50)
    plt.close(fig)
    write_csv(analysis / "fig6.csv", FIG6)
    write_csv(analysis / "table4.csv", TABLE4)
    write_csv(analysis / "payoff.csv", PAYOFF)
    NetworkProfile(alpha=2e-4, beta=8e-9, name="emulated", cluster={"bandwidth": "1gbit"}).save(
        root / "expA" / "net" / "emulated_bandwidth-1gbit" / "profile.json"
    )
    return jobs


def export(root: Path, out: Path, capsys) -> str:
    """``python -m analysis.wandb.export root`` in this process, offline into ``out``;
    returns what it printed."""
    from analysis.wandb import export as wandb_export

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(out))
        wandb_export.main([str(root)])
    return capsys.readouterr().out
