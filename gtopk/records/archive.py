"""Finished jobs kept in git, so that a grid of hours runs across several sittings.

A run directory holds checkpoints and one ``iters.rank<r>.jsonl`` per rank: too much to
commit for a grid of 54 training jobs. ``save`` copies what the analysis of a finished
job reads into an archive folder (committed under ``analysis/results/``):
``config.yaml``, ``summary.json``, ``identity.json``, ``attempts.jsonl``, ``epochs.jsonl``
and rank 0's iteration rows, gzipped (``iters.rank0.jsonl.gz``). ``restore`` puts them
back under the runs folder, where a re-run of the sweep skips them as finished (their
``summary.json`` carries the config's fingerprint, checked as for any job:
``gtopk.records.identity``). A restored job has rank 0's iteration rows only: analyses
that read every rank (the residual spread of ``fig5_gap``) see one rank there; it keeps no
checkpoint, so it cannot be trained longer (``gtopk.records.extension``). A job trained
longer replaces its archived shorter copy; a shorter copy never replaces a longer one.

Local file work only; nothing is collective.

    python -m gtopk.records.archive save runs/fig5_scale analysis/results/fig5_scale/runs
    python -m gtopk.records.archive restore analysis/results/fig5_scale/runs runs/fig5_scale
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

from gtopk.records.extension import TRAIN_EPOCHS, identity_of, replaces
from gtopk.records.identity import setting
from gtopk.records.rundir import ATTEMPTS, CONFIG, EPOCHS, IDENTITY, SUMMARY, RunDir, finished

#: the files of a finished job that its analysis reads (besides rank 0's rows)
KEPT = (CONFIG, SUMMARY, IDENTITY, ATTEMPTS, EPOCHS)
ROWS = "iters.rank0.jsonl.gz"


def _fingerprint(run: RunDir) -> str | None:
    summary = run.summary_if_readable()
    return None if summary is None else summary.get("fingerprint")


def _identity(run: RunDir) -> dict | None:
    """The identity of the finished job in ``run`` (None: not recorded, an older record)."""
    return identity_of(run, _fingerprint(run))


def save(runs: Path, archive: Path) -> list[Path]:
    """Copy every finished job under ``runs`` that the archive lacks (or holds with another
    fingerprint) into ``archive`` at the same relative path; but never a job over the same
    cell trained for more epochs (``extension.replaces``: a run trained longer replaces its
    shorter copy, not the other way round; one line says so). Returns the jobs copied."""
    copied = []
    for run in finished([runs]):
        dest = RunDir(archive / run.path.relative_to(runs))
        if dest.path.is_dir() and _fingerprint(dest) == _fingerprint(run) and (dest.path / ROWS).is_file():
            continue
        if dest.path.is_dir() and not replaces(kept := _identity(dest), new := _identity(run)):
            print(
                f"archive: {dest.path} holds this job trained for {setting(kept, TRAIN_EPOCHS)} epochs; "
                f"{run.path} ({setting(new, TRAIN_EPOCHS)} epochs) is not saved over it",
                file=sys.stderr,
            )
            continue
        tmp = dest.path.with_name(dest.path.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in KEPT:
            if (run.path / name).is_file():
                shutil.copy2(run.path / name, tmp / name)
        with open(run.iters(0), "rb") as src, gzip.open(tmp / ROWS, "wb", compresslevel=9) as out:
            shutil.copyfileobj(src, out)
        if dest.path.exists():
            shutil.rmtree(dest.path)
        tmp.rename(dest.path)  # the archived job appears whole or not at all
        copied.append(dest.path)
    return copied


def restore(archive: Path, runs: Path) -> list[Path]:
    """Put every archived job back under ``runs`` where no finished job stands; a folder
    holding other work (a checkpoint, a failed attempt) is left alone with one line.
    Returns the jobs restored."""
    restored = []
    for saved in finished([archive]):
        dest = RunDir(runs / saved.path.relative_to(archive))
        if dest.summary.exists():
            continue
        if dest.path.exists() and any(dest.path.iterdir()):
            print(f"archive: {dest.path} holds unfinished work; not restored over it", file=sys.stderr)
            continue
        tmp = dest.path.with_name(dest.path.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in KEPT:
            if name != SUMMARY and (saved.path / name).is_file():
                shutil.copy2(saved.path / name, tmp / name)
        with gzip.open(saved.path / ROWS, "rb") as src, open(tmp / RunDir(tmp).iters(0).name, "wb") as out:
            shutil.copyfileobj(src, out)
        shutil.copy2(saved.path / SUMMARY, tmp / SUMMARY)  # last: its presence means finished
        if dest.path.exists():
            dest.path.rmdir()
        tmp.rename(dest.path)
        restored.append(dest.path)
    return restored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gtopk.records.archive", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("save", "restore"))
    parser.add_argument("source", type=Path, help="save: the runs folder; restore: the archive")
    parser.add_argument("dest", type=Path, help="save: the archive; restore: the runs folder")
    args = parser.parse_args(argv)
    if args.action == "restore" and not args.source.exists():
        print(f"archive restore: nothing archived yet in {args.source}")
        return 0
    if not args.source.is_dir():
        print(
            f"archive: {args.source} is not a folder; give the {'runs folder' if args.action == 'save' else 'archive'}",
            file=sys.stderr,
        )
        return 2
    done = (save if args.action == "save" else restore)(args.source, args.dest)
    print(f"archive {args.action}: {len(done)} job(s) -> {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
