"""The README's answer table, generated from the committed CSVs of Fig. 5 at the paper's
training length and of the grid's shorter budget.

    python -m analysis.readme [--check]

rewrites the block between ``BEGIN`` and ``END`` in README.md from
``analysis/results/fig5_paper_length/fig5_paper_length_table.csv`` (one row per P and reducer
trained at the paper's length) and ``analysis/results/fig5_scale/fig5_scale_table.csv`` (the
same cell's gap at the grid's budget); ``--check`` exits 1 when README.md disagrees with them
instead. ``make reproduce-paper-length`` runs it after publishing its table; a unit test fails
when they disagree. Nothing here is collective.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from analysis.reducers import declared, ordered

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAPER = ROOT / "analysis" / "results" / "fig5_paper_length" / "fig5_paper_length_table.csv"
GRID = ROOT / "analysis" / "results" / "fig5_scale" / "fig5_scale_table.csv"
BEGIN = "<!-- answer table: python -m analysis.readme -->"
END = "<!-- end of answer table -->"


def _pct(x: float) -> str:
    return "" if pd.isna(x) else f"{100 * x:.1f}"


def _gap(row: pd.Series) -> str:
    """The gap to dense in points: mean, and (min-max) over seeds when there are several."""
    if pd.isna(row["gap_mean"]):
        return "-"
    mean = f"{100 * row['gap_mean']:.1f}"
    if row["runs"] > 1:
        mean += f" ({100 * row['gap_min']:.1f}-{100 * row['gap_max']:.1f})"
    return mean


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of reducers at their default settings: the label is the reducer's name, its
    density and P, no other setting (a variant such as ``selection=sampled`` is left out)."""
    bare = df["label"].map(lambda lab: all(w.startswith(("rho=", "P=")) for w in str(lab).split()[1:]))
    return df[bare]


def answer_table(paper: Path = PAPER, grid: Path = GRID) -> str:
    """The markdown table: per P and reducer trained at the paper's length, the seeds done,
    final top-1, the gap to dense there and at the grid's budget, coverage, and the
    iterations to 99 % of dense's final top-1 per seed."""
    long, short = _plain(pd.read_csv(paper)), _plain(pd.read_csv(grid))
    order = {name: i for i, name in enumerate(ordered(long["reducer"]))}
    long = long.sort_values(["nodes", "reducer"], key=lambda s: s.map(order) if s.name == "reducer" else -s)
    lines = [
        "| P | reducer | seeds | iterations | final top-1 % | gap to dense, points | same cell at the grid's budget "
        "| coverage | iterations to 99 % of dense |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in long.iterrows():
        same = short[(short["nodes"] == r["nodes"]) & (short["reducer"] == r["reducer"])]
        if len(same):
            s = same.iloc[0]
            at_grid = f"{_gap(s)} at {int(s['iterations']):,} it., coverage {s['coverage']:.3g}"
        else:
            at_grid = "not trained"
        reference = declared(r["reducer"]).exact_average  # dense: no gap, coverage is its iterations
        cov = "-" if reference or math.isnan(r["coverage"]) else f"{r['coverage']:.1f}"
        final = _pct(r["final_top1"])
        if r["runs"] > 1:
            final += f" ({_pct(r['final_top1_min'])}-{_pct(r['final_top1_max'])})"
        lines.append(
            f"| {int(r['nodes'])} | {r['reducer_display']} | {r['runs']} ({r['seeds']}) | {int(r['iterations']):,} "
            f"| {final} | {_gap(r)} | {'-' if reference else at_grid} | {cov} "
            f"| {r['iterations_to_target_per_seed']} |"
        )
    return "\n".join(lines)


def with_table(text: str, table: str) -> str:
    """``text`` with the block between ``BEGIN`` and ``END`` replaced by ``table``."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"README.md lacks the markers {BEGIN!r} ... {END!r}: put them where the table goes")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The README's answer table from the committed CSVs")
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md disagrees, change nothing")
    args = ap.parse_args(argv)
    text = README.read_text()
    new = with_table(text, answer_table())
    if args.check:
        if new != text:
            print("README.md's answer table disagrees with the committed CSVs: run python -m analysis.readme")
            return 1
        return 0
    if new != text:
        README.write_text(new)
        print(f"updated {README.name}'s answer table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
