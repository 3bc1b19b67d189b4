"""``analysis.reproduce.publish``: a target's outputs copied to its results folder with
provenance.md, on a tmp folder with fake outputs (nothing runs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from analysis.reproduce import publish, timing


def write(path: Path, text: str = "x", age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def job(root: Path, name: str, commit: str, cpu: str) -> Path:
    """A finished job: config.yaml and a summary.json whose env names its commit and CPU."""
    d = root / name
    write(d / "config.yaml", "reducer_name: gtopk\n")
    env = {"git_commit": commit, "host": "box", "cpu": cpu, "cpu_count": 2}
    write(d / "summary.json", json.dumps({"t_iter": 0.1, "env": env}))
    return d


@pytest.fixture
def made(tmp_path):
    """A run folder as ``make reproduce-fig6`` leaves it: two jobs, the analysis outputs
    (a PDF among them), the network profile; and a results folder holding an older copy."""
    runs = tmp_path / "runs" / "fig6_reproduce"
    job(runs, "model=vgg16,nodes=8,reducer=gtopk", "abc1234", "Intel(R) Xeon(R) Processor")
    job(runs, "model=vgg16,nodes=1,reducer=ddp", "def5678", "Intel(R) Xeon(R) Processor")
    out = runs / "analysis"
    for name in ("fig6.png", "fig6.pdf", "fig6.csv", "table4.csv", "table4.md", "breakdown.png", "breakdown.csv"):
        write(out / name, f"new {name}")
    write(runs / "net" / "emulated" / "profile.json", '{"alpha": 1e-4}', age_s=3600)  # calibrated earlier
    dest = tmp_path / "results" / "fig6"
    write(dest / "fig6.png", "old figure")
    write(dest / "fig6.svg", "not a kind we publish")
    write(dest / "commmodel.png", "an older run's model figure")
    write(
        dest / "provenance.md",
        "# Provenance of analysis/results/fig6/\n\n## fig6.png, commmodel.png\n\n* command: by hand\n"
        "* commit: 1111111 (written by hand from git history)\n",
    )
    return runs, dest


def test_a_target_publishes_its_outputs_with_their_provenance(made):
    runs, dest = made
    started = time.time() - 60
    outputs = publish.outputs_of(runs / "analysis", ["fig6", "table4", "breakdown", "commmodel"])
    cmd = publish.command("fig6", [], ["model=vgg16"])
    written = publish.publish(
        dest, outputs, cmd, since=started, inputs={"network_profile.json": runs / "net/emulated/profile.json"},
        run_roots=[runs],
    )  # fmt: skip
    names = sorted(p.name for p in dest.iterdir())
    # the outputs and the profile, no PDF; the old figure replaced; files of other kinds and of a
    # stem this run did not make (commmodel: the script did not run) left as they were
    assert names == [
        "breakdown.csv", "breakdown.png", "commmodel.png", "fig6.csv", "fig6.png", "fig6.svg",
        "network_profile.json", "provenance.md", "table4.csv", "table4.md",
    ]  # fmt: skip
    assert (dest / "fig6.png").read_text() == "new fig6.png"
    assert (dest / "commmodel.png").read_text() == "an older run's model figure"
    assert json.loads((dest / "network_profile.json").read_text()) == {"alpha": 1e-4}
    assert dest / "provenance.md" in written and len(written) == 8

    prov = (dest / "provenance.md").read_text()
    sections = publish.sections(prov)
    # this publish's section first, naming what it made; the older one keeps commmodel.png only
    assert sections[0][0] == [
        "breakdown.csv", "breakdown.png", "fig6.csv", "fig6.png", "network_profile.json", "table4.csv", "table4.md",
    ]  # fmt: skip
    assert sections[1][0] == ["commmodel.png"] and "written by hand from git history" in sections[1][1]
    body = sections[0][1]
    assert "* command: `python -m analysis.reproduce fig6 model=vgg16`" in body
    commit = re.search(r"\* commit: (\S+) \((clean tree|uncommitted changes in tracked files)\)", body)
    assert commit and re.fullmatch(r"[0-9a-f]{7,12}", commit.group(1))
    assert re.search(r"\* machine: .+, .*, \d+ CPUs", body)
    assert re.search(r"\* date: \d{4}-\d\d-\d\d \d\d:\d\d UTC", body)
    assert f"* runs: `{runs}`" in body
    assert "  * abc1234, box, Intel(R) Xeon(R) Processor, 2" in body
    assert "  * def5678, box, Intel(R) Xeon(R) Processor, 2" in body


def test_outputs_older_than_the_target_are_not_published(made):
    """A step that did not run (a test's stand-in, a failed script) leaves the outputs of an
    earlier run: those are not this target's, and the results folder is left alone."""
    runs, dest = made
    before = {p.name: p.read_text() for p in dest.iterdir()}
    for p in (runs / "analysis").iterdir():
        os.utime(p, (time.time() - 7200, time.time() - 7200))
    outputs = publish.outputs_of(runs / "analysis", ["fig6", "table4"])
    assert publish.publish(dest, outputs, "cmd", since=time.time() - 60) == []
    assert {p.name: p.read_text() for p in dest.iterdir()} == before


def test_a_second_publish_replaces_its_own_section(made):
    runs, dest = made
    outputs = publish.outputs_of(runs / "analysis", ["table4"])
    publish.publish(dest, outputs, "first", since=None)
    publish.publish(dest, outputs, "second", since=None)
    heads = [files for files, _ in publish.sections((dest / "provenance.md").read_text())]
    assert heads == [["table4.csv", "table4.md"], ["fig6.png", "commmodel.png"]]
    assert "`first`" not in (dest / "provenance.md").read_text()


def test_runs_sent_elsewhere_publish_nothing(tmp_path, monkeypatch):
    own = publish.ROOT / "runs" / "fig6_reproduce"
    assert publish.destination(["model=vgg16"], "fig6", own) == publish.RESULTS / "fig6"
    assert publish.destination([f"hydra.sweep.dir={tmp_path}", "nodes=1,2"], "fig6", own) is None
    monkeypatch.chdir(tmp_path)  # a test's runs/ beside it: not the repository's
    assert publish.destination(["nodes=1,2"], "fig6", Path("runs/fig6_reproduce")) is None
    assert publish.publish(None, {"fig6.png": write(tmp_path / "fig6.png")}, "cmd") == []
    # under pytest nothing lands in the committed results, whatever the caller asks
    assert publish.publish(publish.RESULTS / "fig6", {"fig6.png": tmp_path / "fig6.png"}, "cmd") == []


@pytest.mark.parametrize(
    ("runs", "overrides", "full", "name"),
    [
        ("runs/fig6_reproduce", ["experiment=fig6_reproduce"], False, "fig6"),
        ("runs/fig6_reproduce", ["experiment=fig6_reproduce"], True, "fig6_full"),
        (
            "runs/fig6_reproduce",
            ["experiment=fig6_reproduce", "experiment=fig6_baselines"],
            True,
            "fig6_baselines_full",
        ),
        ("runs/fig6_oktopk", ["experiment=fig6_reproduce", "name=fig6_oktopk"], False, "fig6_oktopk"),
    ],
)
def test_the_results_folder_of_a_scaling_run(runs, overrides, full, name):
    assert timing.results_name(Path(runs), overrides, full) == name


def test_make_reproduce_fig6_publishes_what_its_scripts_wrote(tmp_path, monkeypatch):
    """The whole target with every command replaced: the figure scripts' outputs (written by
    the stand-in) land in ``analysis/results/fig6/`` of a tmp checkout, with the command."""
    from analysis import reproduce
    from analysis.reproduce import steps

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(publish, "ROOT", tmp_path)
    monkeypatch.setattr(publish, "RESULTS", tmp_path / "analysis" / "results")
    monkeypatch.setenv("WANDB_MODE", "offline")
    scripts = []

    def fake_run(cmd: list[str]) -> None:
        if cmd[1:2] == ["-m"] and cmd[2].startswith("analysis.figures."):
            stem = cmd[2].rsplit(".", 1)[1]
            scripts.append(stem)
            out = Path(cmd[3]) / "analysis"
            for kind in (".csv", ".md") if stem == "table4" else (".png", ".pdf", ".csv"):
                write(out / f"{stem}{kind}", f"{stem} of this run")
        if cmd[1:3] == ["-m", "gtopk.perf.netbench"]:
            out = next(c.split("=", 1)[1] for c in cmd if c.startswith("out="))
            write(Path(out) / "profile.json", "{}")

    monkeypatch.setattr(steps, "run", fake_run)
    reproduce.main(["fig6", "cluster=local", "model=resnet20"])
    dest = tmp_path / "analysis" / "results" / "fig6"
    assert scripts == ["fig6", "table4", "breakdown", "commmodel"]
    assert sorted(p.name for p in dest.iterdir()) == [
        "breakdown.csv", "breakdown.png", "commmodel.csv", "commmodel.png", "fig6.csv", "fig6.png",
        "network_profile.json", "provenance.md", "table4.csv", "table4.md",
    ]  # fmt: skip
    prov = (dest / "provenance.md").read_text()
    assert "* command: `python -m analysis.reproduce fig6 cluster=local model=resnet20`" in prov
    assert "* runs: `runs/fig6_reproduce`" in prov

    # the same target with its runs sent elsewhere publishes nothing more
    (dest / "provenance.md").unlink()
    reproduce.main(["fig6", "cluster=local", f"hydra.sweep.dir={tmp_path / 'elsewhere'}"])
    assert not (dest / "provenance.md").exists()


def test_the_scale_figures_keep_the_payoffs_provenance_beside_them(tmp_path):
    """``analysis.figures.scale --publish`` rewrites its own provenance and keeps the section of
    the payoff files ``make payoff`` put in the same folder."""
    import pandas as pd

    from analysis.figures import scale

    out, dest = tmp_path / "analysis", tmp_path / "results"
    for name in ("fig5_scale.png", "fig5_scale_table.md"):
        write(out / name, "new")
    write(dest / "fig5_scale.png", "old")
    write(dest / "payoff_versus.md", "the map")
    write(
        dest / "provenance.md",
        "# Provenance of the Fig. 5 at scale outputs\n\n* made by an older run\n\n"
        "## payoff_versus.md\n\n* command: `python -m analysis.payoff runs/fig5_scale`\n",
    )
    grid = pd.DataFrame([{"nodes": 4, "reducer": "dense", "seed": 0, "state": "missing", "run_dir": ""}])
    scale.publish(out, dest, grid)
    prov = (dest / "provenance.md").read_text()
    assert (dest / "fig5_scale.png").read_text() == "new"
    assert "made by an older run" not in prov and "cells: 0 of 1 finished (1 missing)" in prov
    assert publish.sections(prov) == [(["payoff_versus.md"], "* command: `python -m analysis.payoff runs/fig5_scale`")]


def test_a_tree_is_dirty_by_its_code_not_by_results_already_published(tmp_path, monkeypatch):
    """provenance.md's "uncommitted changes": a target that publishes twice (the figures,
    then the payoff) changed analysis/results/ itself; only other tracked files count."""

    def sh(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "analysis/results/fig").mkdir(parents=True)
    (tmp_path / "analysis/results/fig/fig.csv").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    sh("init", "-q")
    sh("add", ".")
    sh("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(publish, "ROOT", tmp_path)
    assert publish.origin()["dirty"] is False
    (tmp_path / "analysis/results/fig/fig.csv").write_text("b\n")
    assert publish.origin()["dirty"] is False
    assert "(clean tree)" in publish.provenance_lines("cmd", publish.origin())[1]
    (tmp_path / "code.py").write_text("x = 2\n")
    assert publish.origin()["dirty"] is True
