"""Which models' P ranks fit in this machine's memory, decided from measurement: the P beyond
the experiment's sweep (the paper's 16 and 32) that ``make reproduce-fig6 FULL=1``
(``python -m analysis.reproduce fig6 --full``) measures where they fit and leaves modelled
where they do not.

**The rule** (``decide``). Per model, from the finished jobs below P of the reducers the sweep
runs (in the sweep's runs folder), the per-rank memory of the job that would need the most:
``private`` = the summary's ``mem_private_mb`` (the largest rank's Private_Clean +
Private_Dirty of smaps_rollup at the job's end), raised to ``rss_peak_mb - mem_shared_mb``
where that is larger (the largest peak RSS of a rank less the shared part: a step's transient
buffers are freed before the job ends, and all P ranks step at once), and ``shared`` = ``mem_shared_mb`` (its RSS less
private: libraries the ranks map once among them). A summary without them (runs older
than those keys) counts ``rss_peak_mb`` as private and 0 shared: conservative, and said so.
P ranks fit when P x private + shared <= ``FRACTION`` of MemAvailable (``/proc/meminfo``),
read just before that P's sweep (the launcher process and the page cache get the rest). A
model with no such job stays modelled, with a line saying so. The rule assumes a rank's
memory does not grow with P (true of the replayed gradient, the model and the residual;
a reducer's buffers that grow with P show up in the jobs at 4 and 8).

Why here and not in ``gtopk/run``: it reads finished jobs' records and decides which jobs
to launch, as ``analysis.reproduce`` does; the runner runs what it is given.

Each decision is printed (one line per model and P) and kept in ``<runs>/analysis/memfit.csv``,
which ``analysis.figures.fig6`` reads to say why a model's points at that P are modelled.
Nothing here is collective; the functions run in the launcher.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pandas as pd
from hydra.core.override_parser.overrides_parser import OverridesParser

from gtopk import paper
from gtopk.records.rundir import finished

#: the share of MemAvailable that P ranks may take (the rest: the launcher, the page cache, slack)
FRACTION = 0.85
#: where MemAvailable is read (a module attribute so that a test can point it at a file)
MEMINFO = Path("/proc/meminfo")
#: the file of decisions beside the figures, in ``<runs>/analysis/``
CSV = "memfit.csv"

#: ``axis(overrides, key)``: the values ``run.py -m *overrides`` sweeps ``key`` over (``analysis.reproduce.axis``)
Axis = Callable[[list[str], str], list[str]]


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether ``nodes`` ranks of ``model`` fit; the numbers behind it (MiB), and the job they come from."""

    model: str
    nodes: int
    fits: bool
    available_mb: float
    fraction: float
    need_mb: float | None = None  # None: no finished job with memory records
    private_mb: float | None = None
    shared_mb: float | None = None
    source: str = ""  # smaps (mem_private_mb, mem_shared_mb) | rss_peak (older summary: no split)
    run_dir: str = ""

    def line(self) -> str:
        """The one line printed for this decision."""
        usable = f"{self.fraction:g} x {gb(self.available_mb)} GB available"
        head = f"memfit: {self.model} at P = {self.nodes}:"
        if self.need_mb is None:
            return f"{head} left modelled (no finished job of it below P = {self.nodes} with memory records)"
        verdict = "fits" if self.fits else "left modelled"
        how = (
            f"{self.nodes} x {self.private_mb:.0f} MB private + {self.shared_mb:.0f} MB shared"
            if self.source == "smaps"
            else f"{self.nodes} x {self.private_mb:.0f} MB rss_peak_mb, counted as private, 0 shared "
            "(summary without mem_private_mb, mem_shared_mb: conservative)"
        )
        return f"{head} {verdict} (needs {gb(self.need_mb)} GB, {usable}; {how}, from {self.run_dir})"


def short(row: Mapping) -> str:
    """Why a model's P ranks were left modelled, from a row of ``CSV`` (a ``Decision`` as a dict)."""
    need = _number(row.get("need_mb"))
    if need is None:
        return "no job with memory records below it"
    return f"needs {gb(need)} GB > {row['fraction']:g} x {gb(row['available_mb'])} GB available"


def gb(mb: float) -> str:
    return f"{mb / 1024:.1f}"


def mem_available_mb(meminfo: Path | None = None) -> float:
    """MemAvailable of ``meminfo`` (default ``MEMINFO``), MiB."""
    for line in Path(meminfo or MEMINFO).read_text().splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            value, unit = rest.split()
            if unit != "kB":
                raise ValueError(f"MemAvailable in {unit!r}, not kB")
            return int(value) / 1024.0
    raise ValueError(f"no MemAvailable in {meminfo or MEMINFO}")


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def per_rank(summary: dict) -> tuple[float, float, str] | None:
    """(private, shared, source) of one job's summary (the module docstring's rule); None
    where it records no memory."""
    private, shared = _number(summary.get("mem_private_mb")), _number(summary.get("mem_shared_mb"))
    peak = _number(summary.get("rss_peak_mb"))
    if private is not None and shared is not None:
        return max(private, (peak or 0.0) - shared), shared, "smaps"
    return (peak, 0.0, "rss_peak") if peak else None


def memory_jobs(runs: Iterable[str | Path], reducers: Iterable[str]) -> pd.DataFrame:
    """One row per finished job under ``runs`` of one of ``reducers`` that records memory:
    model, nodes, private_mb, shared_mb, source, run_dir."""
    wanted, rows = set(reducers), []
    for d in finished(runs):
        s = d.read_summary()
        mem = per_rank(s)
        if mem is not None and s.get("reducer") in wanted and isinstance(s.get("nodes"), int):
            private, shared, source = mem
            rows.append(
                dict(
                    model=s.get("model"),
                    nodes=s.get("nodes"),
                    private_mb=private,
                    shared_mb=shared,
                    source=source,
                    run_dir=str(d.path),
                )
            )
    return pd.DataFrame(rows, columns=["model", "nodes", "private_mb", "shared_mb", "source", "run_dir"])


def decide(
    jobs: pd.DataFrame, models: Iterable[str], nodes: int, available_mb: float, fraction: float = FRACTION
) -> list[Decision]:
    """Per model, whether ``nodes`` ranks fit (the module docstring's rule), from the rows of
    ``jobs`` (``memory_jobs``) below ``nodes``: the row with the largest P x private + shared."""
    out = []
    for model in models:
        rows = jobs[(jobs["model"] == model) & (jobs["nodes"] < nodes)]
        if rows.empty:
            out.append(Decision(model, nodes, False, available_mb, fraction))
            continue
        need = nodes * rows["private_mb"] + rows["shared_mb"]
        top = rows.loc[need.idxmax()]
        out.append(
            Decision(
                model,
                nodes,
                bool(need.max() <= fraction * available_mb),
                available_mb,
                fraction,
                float(need.max()),
                float(top["private_mb"]),
                float(top["shared_mb"]),
                str(top["source"]),
                str(top["run_dir"]),
            )
        )
    return out


def record(decisions: list[Decision], folder: Path) -> Path:
    """Keep ``decisions`` in ``folder/CSV``, replacing earlier ones at the same P."""
    path = folder / CSV
    new = pd.DataFrame([{**dataclasses.asdict(d), "line": d.line()} for d in decisions])
    if path.exists():
        old = pd.read_csv(path)
        new = pd.concat([old[~old["nodes"].isin(new["nodes"])], new], ignore_index=True)
    folder.mkdir(parents=True, exist_ok=True)
    new.sort_values(["nodes", "model"]).to_csv(path, index=False)
    return path


def read(roots: Iterable[str | Path]) -> pd.DataFrame:
    """The decisions kept under ``roots`` (``<root>/analysis/memfit.csv``; empty without any)."""
    found = [pd.read_csv(p) for p in (Path(r) / "analysis" / CSV for r in roots) if p.exists()]
    return pd.concat(found, ignore_index=True) if found else pd.DataFrame(columns=["model", "nodes", "fits", "line"])


def _without(overrides: list[str], *drop: str) -> list[str]:
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [text for text, o in zip(overrides, parsed) if o.key_or_group not in drop]


def split(overrides: list[str], axis: Axis) -> tuple[list[str] | None, list[int]]:
    """``--full``'s two parts: the overrides of the usual sweep (None where nothing is left
    of it) and the P beyond it, each fit-checked and swept on its own (``sweep_at``). Beyond
    is above the experiment's own largest P: the user's ``nodes`` there, or without a
    ``nodes`` override the paper's P there (16, 32: ``gtopk/paper/throughput.csv``)."""
    others = _without(overrides, "nodes")
    top = max(int(p) for p in axis(others, "nodes"))
    if others == overrides:  # no nodes override
        return overrides, sorted({int(r["nodes"]) for r in paper.rows(paper.THROUGHPUT) if int(r["nodes"]) > top})
    given = [int(p) for p in axis(overrides, "nodes")]
    base = [p for p in given if p <= top]
    return (others + [f"nodes={','.join(map(str, base))}"] if base else None), [p for p in given if p > top]


def sweep_at(overrides: list[str], nodes: int, runs: Path, axis: Axis, meminfo: Path | None = None) -> list[str] | None:
    """The overrides of the sweep at ``nodes`` over the models (``axis(overrides, "model")``)
    whose ``nodes`` ranks fit, from the jobs of its reducers in ``runs`` and MemAvailable read
    now; None where none fits. Prints a line per model and keeps them (``record``)."""
    available = mem_available_mb(meminfo)
    jobs = memory_jobs([runs], axis(overrides, "reducer"))
    decisions = decide(jobs, axis(overrides, "model"), nodes, available)
    for d in decisions:
        print(d.line(), flush=True)
    record(decisions, runs / "analysis")
    fit = [d.model for d in decisions if d.fits]
    if not fit:
        print(f"memfit: P = {nodes}: no model fits; every point there stays modelled", flush=True)
        return None
    return _without(overrides, "nodes", "model") + [f"nodes={nodes}", f"model={','.join(fit)}"]
