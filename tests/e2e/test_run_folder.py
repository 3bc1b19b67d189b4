"""The run folder as a contract (``gtopk.records.claim``): a job writes only into a folder
that is new, empty or its own; ``rerun=true`` moves only what a job wrote; the checkout,
``/`` and system folders are refused before Hydra creates anything; a folder name of over
255 bytes is shortened with a hash; an unusable folder is one line, exit 2."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gtopk.records.claim import MARKER, NAME_MAX, folder_problem, forbidden, short_folder
from gtopk.records.rundir import SUPERSEDED
from tests.procs import FAST, ROOT, one_line_error, run


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def users_folder(tmp_path):
    d = tmp_path / "my_project"
    (d / "mydata").mkdir(parents=True)
    (d / "thesis.tex").write_text("\\documentclass{article}")
    (d / "mydata" / "x.csv").write_text("1,2\n")
    return d


def test_a_users_folder_is_refused_and_left_untouched(tmp_path):
    d = users_folder(tmp_path)
    before = listing(d)
    for extra in ([], ["rerun=true"]):
        done = run(*FAST, f"hydra.run.dir={d}", *extra)
        assert done.returncode == 2, done.stderr[-2000:]
        line = one_line_error(done.stderr)
        assert "thesis.tex" in line and "hydra.run.dir=" in line and "rerun=true" in line
        assert listing(d) == before  # no .hydra, no log, no marker


def test_a_sweep_into_a_users_folder_is_refused(tmp_path):
    d = users_folder(tmp_path)
    before = listing(d)
    done = run("-m", *FAST, f"hydra.sweep.dir={d}", "seed=0,1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "thesis.tex" in one_line_error(done.stderr)
    assert listing(d) == before


def git_status():
    return subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=ROOT, capture_output=True, text=True
    ).stdout


def test_the_checkout_is_refused_outright():
    before = git_status()
    done = run(*FAST, "hydra.run.dir=.")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "checkout" in one_line_error(done.stderr)
    assert git_status() == before and not (ROOT / ".hydra").exists() and not (ROOT / MARKER).exists()


def test_root_system_and_home_folders_are_refused_without_writing():
    checkout = ROOT.resolve()
    for folder in ("/", "/usr", "/usr/local/x", "/proc", "/etc/gtopk", os.path.expanduser("~")):
        assert forbidden(Path(folder).resolve(), checkout), folder
    assert forbidden(checkout.parent, checkout) == "holds this project's checkout"
    assert forbidden(checkout / "gtopk", checkout) is None  # not forbidden as such: it holds foreign files
    assert "holds files that no job" in folder_problem("hydra.run.dir", str(checkout / "gtopk"))


def test_rerun_moves_only_what_the_job_wrote(tmp_path):
    d = tmp_path / "job"
    first = run(*FAST, f"hydra.run.dir={d}")
    assert first.returncode == 0, first.stderr[-2000:]
    assert (d / MARKER).exists()
    (d / "thesis.tex").write_text("mine")  # the user drops files into the job's folder
    (d / "mydata").mkdir()
    again = run(*FAST, "model.lr=0.2", "rerun=true", f"hydra.run.dir={d}")
    assert again.returncode == 0, again.stderr[-2000:]
    (moved,) = (d / SUPERSEDED).iterdir()
    assert {p.name for p in moved.iterdir()} == {
        "attempts.jsonl",
        "config.yaml",
        "identity.json",
        "iters.rank0.jsonl",
        "summary.json",
    }
    assert (d / "thesis.tex").read_text() == "mine" and (d / "mydata").is_dir()


def test_a_folder_from_before_the_marker_is_the_projects(tmp_path):
    from gtopk.records.claim import ForeignFolder, claim

    old = tmp_path / "old"
    old.mkdir()
    (old / "attempts.jsonl").write_text("{}\n")  # a run in progress from before the marker
    (old / "notes.txt").write_text("the user's")
    claim(old)
    assert (old / MARKER).exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("the user's")
    with pytest.raises(ForeignFolder, match="notes.txt"):
        claim(foreign)
    assert not (foreign / MARKER).exists()
    fresh = tmp_path / "fresh"
    (fresh / ".hydra").mkdir(parents=True)  # what Hydra writes before the job
    (fresh / "run.log").write_text("")
    claim(fresh)
    assert (fresh / MARKER).exists()


def test_a_folder_name_over_255_bytes_is_shortened(tmp_path):
    long = ["mode=train", "cluster=simulated", "nodes=2", "data=digits", "data.train_size=64", "data.test_size=16"]
    long += ["train.epochs=1", "batch_size=4", "reducer=topk", "density=0.01", "seed=1", "model.lr=0.05"]
    long += ["train.density_warmup.epochs=0", "train.loader_workers=0", "logger.wandb=false", "model.momentum=0.85"]
    long += ["model.weight_decay=0.0002", "data.image_size=8"]
    assert len(",".join(long).encode()) > NAME_MAX
    done = run("-m", *long, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert done.returncode == 0, done.stderr[-2000:]
    (job,) = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    assert len(job.name.encode()) <= NAME_MAX and (job / "summary.json").exists()
    full = OmegaConf.load(job / ".hydra" / "hydra.yaml").hydra.job.override_dirname  # the whole name, kept
    assert len(full.encode()) > NAME_MAX and job.name == short_folder(full) and job.name[:200] == full[:200]


def test_short_folder_is_stable_and_within_the_limit():
    assert short_folder("seed=1") == "seed=1"
    name = "é" * 200  # 400 bytes
    assert short_folder(name) == short_folder(name) and len(short_folder(name).encode()) <= NAME_MAX
    assert short_folder(name) != short_folder(name + "x")


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    done = run(*FAST, f"hydra.run.dir={tmp_path / 'afile' / 'run'}")
    assert done.returncode == 2 and "is a file, not a folder" in one_line_error(done.stderr)


@contextlib.contextmanager
def tmpfs(folder: Path, options: str):
    """A tmpfs mounted at ``folder`` for the block (skips without root and mount)."""
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)]).returncode:
        pytest.skip(f"needs root and mount (a tmpfs, {options})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)])


def test_a_read_only_mount_is_refused(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        done = run(*FAST, f"hydra.run.dir={ro / 'run'}")
        assert done.returncode == 2 and "is not writable" in one_line_error(done.stderr)


def test_a_full_disk_is_one_line_and_leaves_no_temp_file(tmp_path):
    from tests.procs import simulated_train

    with tmpfs(tmp_path / "full", "size=300k") as full:
        done = run(*simulated_train(nodes=2, epochs=3, train_size=64, test_size=16), f"hydra.run.dir={full / 'job'}")
        assert done.returncode == 2, done.stderr[-3000:]  # the disk's cause, not the job's
        errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "is full" in errors[0] and "re-run the same command" in errors[0], done.stderr
        assert "Logging error" not in done.stderr and "Traceback" not in done.stderr
        assert not list((full / "job").glob(".*.tmp*"))
