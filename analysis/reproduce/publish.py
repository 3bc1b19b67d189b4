"""Publishing: a ``make reproduce-*`` target's current outputs copied to ``analysis/results/<name>/``
with ``provenance.md`` (the command, the commit and whether the tree had uncommitted changes
outside ``analysis/results/``, the
machine, the date, and the commits and machines the runs record).

* ``publish(dest, outputs, command, since=..., inputs=..., runs=...)``: each output (a dict
  ``{name in dest: source file}``) that exists, and was written at or after ``since`` (the
  target's start: a step that did not run writes nothing, and an output left from an earlier
  run is not passed off as this one's), replaces the files of its name's stem in ``dest``
  (``fig6.png`` and ``fig6.csv`` replace ``fig6.*``); ``inputs`` (the network profile the
  model used) go with them only when some output did. ``provenance.md`` keeps one section per
  publish, headed by the files it made; a file made again leaves its older section.
* ``origin()``: this checkout's commit, the machine and the date; ``run_origins(roots)``: the
  commits and machines the finished jobs under ``roots`` record (their ``summary.json``'s
  ``env``); ``analysis.figures.scale`` writes its provenance from the same two.
* ``destination(overrides, name, runs)``: where a target publishes: ``analysis/results/<name>``,
  or nothing when the runs are not the repository's ``runs/`` (``hydra.sweep.dir=``, a test's
  folder); nothing is published into ``analysis/results/`` under pytest either.

The folders and what each holds: docs/results.md.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "analysis" / "results"
_COMMITTED = RESULTS  # what a test must never write into, whatever it sets RESULTS to
PROVENANCE = "provenance.md"
#: the kinds of file a target publishes (figures as PNG; PDFs stay in the run folder)
KINDS = (".csv", ".png", ".md", ".json", ".txt")


def git(*args: str) -> str:
    """``git args`` in the repository, its output stripped; empty outside a checkout."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, as a job's ``summary.json`` records it)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "")


def origin() -> dict:
    """Where and when this is made: ``commit`` (short hash, "unknown" outside a checkout),
    ``dirty`` (tracked files with uncommitted changes, published results aside: a target's own
    earlier outputs are not a change to what made them), ``host``, ``cpu``, ``cpus``, ``date``."""
    return {
        "commit": git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)",
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)analysis/results")),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def machine(o: Mapping) -> str:
    return f"{o['host']}, {o['cpu']}, {o['cpus']} CPUs"


def run_origins(run_paths: Iterable[str | Path]) -> list[tuple]:
    """(commit, host, CPU, CPUs) of each distinct origin among the finished jobs in
    ``run_paths`` (run directories), from their ``summary.json``'s ``env``; "?" where unrecorded."""
    from gtopk.records.rundir import RunDir

    made = set()
    for path in run_paths:
        env = (RunDir(Path(path)).summary_if_readable() or {}).get("env") or {}
        made.add(tuple(str(env.get(k, "?")) for k in ("git_commit", "host", "cpu", "cpu_count")))
    return sorted(made)


def jobs_under(roots: Iterable[str | Path]) -> list[Path]:
    """The finished jobs (run directories with a summary) under ``roots``."""
    from gtopk.records.rundir import run_dirs

    return [d.path for d in run_dirs([r for r in roots if Path(r).is_dir()]) if d.summary.exists()]


def destination(overrides: Iterable[str], name: str, runs: str | Path) -> Path | None:
    """``analysis/results/<name>``, or None when the runs are not the repository's own
    (``runs`` outside its ``runs/``: a test's folder) or the overrides send them elsewhere
    (``hydra.sweep.dir=``): such a run's outputs are not the target's result."""
    if any(o.split("=", 1)[0].lstrip("+~") == "hydra.sweep.dir" for o in overrides):
        return None
    if not Path(runs).resolve().is_relative_to((ROOT / "runs").resolve()):
        return None
    return RESULTS / name


def command(target: str, flags: Iterable[str] = (), overrides: Iterable[str] = ()) -> str:
    """The ``python -m analysis.reproduce`` line of a target, as provenance.md quotes it."""
    return shlex.join(["python", "-m", "analysis.reproduce", target, *flags, *overrides])


def copy(sources: Mapping[str, Path], dest: Path) -> list[Path]:
    """Copy ``{name: source}`` into ``dest`` (created), each replacing the files of its
    name's stem there (any of ``KINDS``); returns the copies."""
    dest.mkdir(parents=True, exist_ok=True)
    for stem in {Path(n).stem for n in sources}:
        for old in dest.glob(f"{stem}.*"):
            if old.suffix in KINDS and old.name != PROVENANCE:
                old.unlink()
    return [Path(shutil.copy2(src, dest / name)) for name, src in sorted(sources.items())]


def sections(text: str) -> list[tuple[list[str], str]]:
    """provenance.md's sections: (the files a heading names, the section's body)."""
    out: list[tuple[list[str], str]] = []
    for block in ("\n" + text).split("\n## ")[1:]:
        head, _, body = block.partition("\n")
        out.append(([f.strip() for f in head.split(",") if f.strip()], body.strip("\n")))
    return out


def section(files: Iterable[str], lines: Iterable[str]) -> str:
    return "## " + ", ".join(files) + "\n\n" + "\n".join(lines) + "\n"


def write_provenance(dest: Path, made: list[str], lines: list[str]) -> Path:
    """provenance.md in ``dest``: a section for ``made`` (its ``lines``) first, then the older
    sections of files still there and not made again."""
    path = dest / PROVENANCE
    kept = []
    if path.exists():
        for files, body in sections(path.read_text()):
            left = [f for f in files if f not in made and (dest / f).exists()]
            if left:
                kept.append(section(left, [body]))
    title = f"# Provenance of analysis/results/{dest.name}/\n\n"
    path.write_text(title + "\n".join([section(made, lines), *kept]))
    return path


def provenance_lines(
    cmd: str, o: Mapping, runs: Iterable[tuple] = (), run_roots: Iterable[str | Path] = ()
) -> list[str]:
    """The bullet lines of one publish: command, commit, machine, date and the runs' origins."""
    tree = "uncommitted changes in tracked files" if o["dirty"] else "clean tree"
    lines = [
        f"* command: `{cmd}`",
        f"* commit: {o['commit']} ({tree})",
        f"* machine: {machine(o)}",
        f"* date: {o['date']}",
    ]
    roots = [str(r) for r in run_roots]
    runs = list(runs)
    if roots:
        lines.append(f"* runs: {', '.join(f'`{r}`' for r in roots)}")
    if runs:
        lines.append("* the jobs ran at (commit, host, CPU, CPUs):")
        lines += [f"  * {', '.join(r)}" for r in runs]
    return lines


def publish(
    dest: Path | None,
    outputs: Mapping[str, Path],
    cmd: str,
    since: float | None = None,
    inputs: Mapping[str, Path] | None = None,
    run_roots: Iterable[str | Path] = (),
) -> list[Path]:
    """Copy the ``outputs`` that exist (and were written at or after ``since``, seconds since
    the epoch) into ``dest``, with ``inputs`` when any output was copied, and write their
    section of provenance.md (``cmd``, ``origin()``, the jobs under ``run_roots``); returns
    the files written, nothing when there was nothing new or no ``dest``."""
    if dest is None:
        print("not published to analysis/results/: the runs are not in the target's own folder", flush=True)
        return []
    if os.environ.get("PYTEST_CURRENT_TEST") and Path(dest).resolve().is_relative_to(_COMMITTED.resolve()):
        print(f"not published to {dest} under a test: the committed results stay as they are", flush=True)
        return []

    def fresh(p: Path) -> bool:
        return p.is_file() and (since is None or p.stat().st_mtime >= since - 1)

    new = {n: Path(p) for n, p in outputs.items() if fresh(Path(p))}
    if not new:
        print(f"nothing new to publish to {dest}", flush=True)
        return []
    new |= {n: Path(p) for n, p in (inputs or {}).items() if Path(p).is_file()}
    copied = copy(new, dest)
    roots = list(run_roots)
    lines = provenance_lines(cmd, origin(), run_origins(jobs_under(roots)), roots)
    written = [*copied, write_provenance(dest, [p.name for p in copied], lines)]
    for p in written:
        print(f"published {p}", flush=True)
    return written


def outputs_of(folder: Path, stems: Iterable[str]) -> dict[str, Path]:
    """``{name: path}`` of every ``stem.<kind>`` a script may have written in ``folder``
    (``KINDS`` but provenance.md), existing or not: ``publish`` keeps those that exist."""
    return {f"{s}{k}": folder / f"{s}{k}" for s in stems for k in KINDS}
