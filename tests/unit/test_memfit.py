"""``make reproduce-fig6 FULL=1``: the memory rule that decides which models' P ranks are
measured at P = 16 and 32 (``analysis.memfit``), on written summaries and a fake
/proc/meminfo with hand-computed numbers; the sweeps ``--full`` plans (the argument lists,
never run); and the figure's CSV saying why a point is modelled."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis import memfit, reproduce
from analysis.figures import fig6
from analysis.reproduce import steps
from tests.unit.test_analysis import runs  # noqa: F401 - a fixture (resnet20 at P = 1, 2, 4)

# MemAvailable 20,971,520 kB = 20,480 MiB; 0.85 of it: 17,408 MiB usable
MEMINFO = "MemTotal:       24684084 kB\nMemFree:         1000000 kB\nMemAvailable:   20971520 kB\n"
AVAILABLE, USABLE = 20480.0, 17408.0


def write_summary(root: Path, model: str, nodes: int, reducer: str, **memory) -> Path:
    """A finished job (config.yaml + summary.json) of ``model`` at ``nodes`` with ``memory`` (MiB)."""
    d = root / f"model={model},nodes={nodes},reducer={reducer}"
    d.mkdir(parents=True)
    cfg = {"name": "fig6_reproduce", "reducer": {}, "reducer_name": reducer, "model_name": model, "nodes": nodes}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "summary.json").write_text(json.dumps({"model": model, "nodes": nodes, "reducer": reducer, **memory}))
    return d


@pytest.fixture
def fig6_runs(tmp_path, monkeypatch):
    """A P <= 8 sweep's finished jobs under ``runs/fig6_reproduce`` of a fresh folder (the
    working directory), and MEMINFO pointed at a fake one."""
    monkeypatch.chdir(tmp_path)
    root = Path("runs/fig6_reproduce")
    # resnet20: private 400, or its peak 800 - 500 shared = 300: 400. P = 16: 6,900; P = 32: 13,300 (fit)
    write_summary(root, "resnet20", 8, "gtopk", mem_private_mb=400.0, mem_shared_mb=500.0, rss_peak_mb=800.0)
    write_summary(root, "resnet20", 1, "ddp", mem_private_mb=350.0, mem_shared_mb=500.0, rss_peak_mb=850.0)
    # vgg16: its peak 1,100 - 500 = 600 over 550 at the end. P = 16: 10,100 (fits); P = 32: 19,700 (not)
    write_summary(root, "vgg16", 8, "dense", mem_private_mb=550.0, mem_shared_mb=500.0, rss_peak_mb=1100.0)
    # alexnet: an older summary: rss_peak_mb as private, 0 shared. P = 16: 17,600 > 17,408
    write_summary(root, "alexnet", 4, "topk", rss_peak_mb=1100.0)
    # resnet50: only a job of a reducer the sweep does not run: no evidence
    write_summary(root, "resnet50", 2, "ddp_fp16", mem_private_mb=10.0, mem_shared_mb=10.0, rss_peak_mb=20.0)
    (tmp_path / "meminfo").write_text(MEMINFO)
    monkeypatch.setattr(memfit, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setenv("WANDB_MODE", "offline")  # steps.export sets it otherwise, for good
    return root


def test_mem_available_is_read_in_mib(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    assert memfit.mem_available_mb(tmp_path / "meminfo") == AVAILABLE
    (tmp_path / "none").write_text("MemTotal: 10 kB\n")
    with pytest.raises(ValueError, match="MemAvailable"):
        memfit.mem_available_mb(tmp_path / "none")


def test_per_rank_memory_of_a_summary():
    # end-of-job private, unless the peak less the shared part is larger
    assert memfit.per_rank({"mem_private_mb": 500, "mem_shared_mb": 400, "rss_peak_mb": 700}) == (500, 400, "smaps")
    assert memfit.per_rank({"mem_private_mb": 500, "mem_shared_mb": 400, "rss_peak_mb": 1000}) == (600, 400, "smaps")
    assert memfit.per_rank({"rss_peak_mb": 1200}) == (1200, 0, "rss_peak")  # older run: conservative
    assert memfit.per_rank({"mem_private_mb": 500, "rss_peak_mb": 900}) == (900, 0, "rss_peak")  # no split
    assert memfit.per_rank({"t_iter": 0.1}) is None


def test_the_fit_rule_on_written_summaries(fig6_runs):
    # a job at P = 16 counts for P = 32 (below it), not for P = 16
    write_summary(fig6_runs, "resnet20", 16, "gtopk", mem_private_mb=5000.0, mem_shared_mb=0.0, rss_peak_mb=5000.0)
    jobs = memfit.memory_jobs([fig6_runs], ["dense", "topk", "gtopk", "oktopk", "ddp"])
    models = ["vgg16", "resnet20", "alexnet", "resnet50"]
    at16 = {d.model: d for d in memfit.decide(jobs, models, 16, AVAILABLE)}
    at32 = {d.model: d for d in memfit.decide(jobs, models, 32, AVAILABLE)}
    assert (at16["resnet20"].need_mb, at16["resnet20"].fits) == (16 * 400 + 500, True)  # the P = 16 job: not below
    assert (at32["resnet20"].need_mb, at32["resnet20"].fits) == (5000 * 32, False)  # below 32 it is
    assert (at16["vgg16"].need_mb, at16["vgg16"].fits) == (10100, True)
    assert (at32["vgg16"].need_mb, at32["vgg16"].fits) == (19700, False)
    assert (at16["alexnet"].need_mb, at16["alexnet"].fits, at16["alexnet"].source) == (17600, False, "rss_peak")
    assert at16["resnet50"].need_mb is None and not at16["resnet50"].fits
    assert at32["vgg16"].line().startswith("memfit: vgg16 at P = 32: left modelled (needs 19.2 GB, 0.85 x 20.0 GB")
    assert "counted as private, 0 shared" in at16["alexnet"].line()
    assert "no finished job" in at16["resnet50"].line()
    assert at16["resnet20"].line().startswith("memfit: resnet20 at P = 16: fits (needs 6.7 GB")
    # the bound itself: 17,408 MiB fits, a MiB more does not
    edge = pd.DataFrame([dict(model="m", nodes=1, private_mb=1088.0, shared_mb=0.0, source="smaps", run_dir="d")])
    assert memfit.decide(edge, ["m"], 16, AVAILABLE)[0].fits
    assert not memfit.decide(edge.assign(shared_mb=1.0), ["m"], 16, AVAILABLE)[0].fits


def test_split_respects_the_users_nodes():
    assert memfit.split(["experiment=fig6_baselines"], reproduce.axis) == (["experiment=fig6_baselines"], [16, 32])
    base = ["experiment=fig6_reproduce", "model=resnet20"]
    assert memfit.split(base + ["nodes=16"], reproduce.axis) == (None, [16])
    assert memfit.split(base + ["nodes=1,8,32"], reproduce.axis) == (base + ["nodes=1,8"], [32])
    assert memfit.split(base + ["nodes=2"], reproduce.axis) == (base + ["nodes=2"], [])


def sweeps(calls: list[list[str]]) -> list[list[str]]:
    """The ``run.py -m`` argument lists among the commands ``steps.run`` was given."""
    return [c[3:] for c in calls if c[1] == str(reproduce.ROOT / "run.py")]


def test_full_plans_a_sweep_per_p_over_the_models_that_fit(fig6_runs, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(steps, "run", calls.append)
    reproduce.main(["fig6", "--full", "cluster=local"])
    base = ["experiment=fig6_reproduce", "cluster=local"]
    v1 = base + ["nodes=1", "reducer=ddp"]  # the v_1 jobs (reproduce.v1_sweep), none beyond
    assert sweeps(calls) == [
        base,
        v1,
        base + ["nodes=16", "model=vgg16,resnet20"],
        base + ["nodes=32", "model=resnet20"],
    ]
    scripts = [c[2] for c in calls if c[1] == "-m"]
    assert scripts[0] == "gtopk.perf.netbench" and scripts[-1] == "analysis.wandb.export"
    assert scripts[1:-1] == [f"analysis.figures.{s}" for s in reproduce.SCALING_SCRIPTS["fig6"]]
    out = capsys.readouterr().out
    assert "memfit: alexnet at P = 16: left modelled (needs 17.2 GB, 0.85 x 20.0 GB available" in out
    kept = pd.read_csv(fig6_runs / "analysis" / memfit.CSV)
    assert sorted(zip(kept["nodes"], kept["model"], kept["fits"])) == [
        (16, "alexnet", False),
        (16, "resnet20", True),
        (16, "resnet50", False),
        (16, "vgg16", True),
        (32, "alexnet", False),
        (32, "resnet20", True),
        (32, "resnet50", False),
        (32, "vgg16", False),
    ]


def test_full_keeps_the_users_models_nodes_and_variants(fig6_runs, monkeypatch):
    calls = []
    monkeypatch.setattr(steps, "run", calls.append)
    args = [
        "fig6",
        "--full",
        "cluster=local",
        "model=resnet20,alexnet",
        "nodes=2,16",
        "--variants",
        "selection=sampled",
    ]
    reproduce.main(args)
    base = ["experiment=fig6_reproduce", "cluster=local"]
    sampled = reproduce.variant_sweeps(base + ["model=resnet20", "nodes=16"], [("selection", "sampled")])
    assert sampled and sweeps(calls) == [
        base + ["model=resnet20,alexnet", "nodes=2"],
        *reproduce.variant_sweeps(base + ["model=resnet20,alexnet", "nodes=2"], [("selection", "sampled")]),
        base + ["nodes=16", "model=resnet20"],
        *reproduce.variant_sweeps(base + ["nodes=16", "model=resnet20"], [("selection", "sampled")]),
    ]


def test_without_full_the_sweep_is_the_experiments(fig6_runs, monkeypatch):
    calls = []
    monkeypatch.setattr(steps, "run", calls.append)
    reproduce.main(["fig6", "cluster=local"])
    base = ["experiment=fig6_reproduce", "cluster=local"]
    assert sweeps(calls) == [base, base + ["nodes=1", "reducer=ddp"]]
    assert not (fig6_runs / "analysis" / memfit.CSV).exists()


def test_no_model_fits_no_sweep(fig6_runs, tmp_path, monkeypatch):
    (tmp_path / "meminfo").write_text("MemAvailable:     102400 kB\n")  # 100 MiB
    calls = []
    monkeypatch.setattr(steps, "run", calls.append)
    reproduce.main(["fig6", "--full", "cluster=local", "nodes=16,32"])
    assert sweeps(calls) == []


def test_fig6_says_why_a_point_is_modelled(runs):  # noqa: F811 - the fixture
    root, profile = runs
    decisions = [
        memfit.Decision("resnet20", 16, False, AVAILABLE, 0.85, need_mb=20480.0, private_mb=1280.0, shared_mb=0.0),
        memfit.Decision("resnet20", 2, True, AVAILABLE, 0.85, need_mb=1000.0, private_mb=500.0, shared_mb=0.0),
    ]
    memfit.record(decisions, root / "analysis")
    fig6.main([str(root), "--network", str(profile)])
    df = pd.read_csv(root / "analysis" / "fig6.csv", keep_default_na=False)
    mod = df[df["kind"] == "modelled"].groupby("nodes")["why_modelled"].agg(set)
    assert mod[16] == {"left modelled by memfit: needs 20.0 GB > 0.85 x 20.0 GB available"}
    assert mod[32] == {"not run"}
    assert mod[1] == mod[2] == mod[4] == {""}  # measured there
    assert set(df.loc[df["kind"] == "measured", "why_modelled"]) == {""}


def test_validate_full_plans_p16_and_p32_of_its_model(tmp_path, monkeypatch):
    """``make validate-model FULL=1``: the P <= 8 sweep, then one sweep per P beyond it
    (16, 32) at the experiment's model when its ranks fit, then the validation script over
    both bandwidths' profiles (the argument lists, never run)."""
    monkeypatch.chdir(tmp_path)
    root = Path("runs/model_validation")
    # resnet20: 400 private + 500 shared; P = 32 needs 32 x 400 + 500 = 13,300 MiB <= 17,408
    write_summary(root, "resnet20", 8, "gtopk", mem_private_mb=400.0, mem_shared_mb=500.0, rss_peak_mb=800.0)
    (tmp_path / "meminfo").write_text(MEMINFO)
    monkeypatch.setattr(memfit, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setenv("WANDB_MODE", "offline")
    calls = []
    monkeypatch.setattr(steps, "run", calls.append)
    reproduce.main(["validate", "--full", "cluster=emulated"])
    base = ["experiment=model_validation", "cluster=emulated"]
    assert sweeps(calls) == [base, base + ["nodes=16", "model=resnet20"], base + ["nodes=32", "model=resnet20"]]
    script = next(c for c in calls if c[1:3] == ["-m", "analysis.payoff.validate"])
    profiles = [p for p in script if p.endswith("profile.json")]
    assert len(profiles) == 2 and "100mbit" in profiles[0] and "1gbit" in profiles[1]
