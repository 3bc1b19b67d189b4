"""README.md as the front door: its answer table agrees with the committed CSVs, it stays
under 8 kB with its first command on the first screen, names no commit, and every file it
links exists."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from analysis import readme

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "README.md").read_text()


def test_the_answer_table_agrees_with_the_committed_csvs():
    assert readme.main(["--check"]) == 0, "run python -m analysis.readme and commit README.md"


def test_the_table_follows_the_csv(tmp_path):
    """A changed measurement changes the table: the gap and the seeds come from the CSV."""
    df = pd.read_csv(readme.PAPER, dtype={"seeds": str})
    row = df.index[(df["reducer"] == "gtopk") & (df["nodes"] == 32)][0]
    df.loc[row, ["gap_mean", "gap_min", "gap_max", "runs", "seeds"]] = [0.021, 0.01, 0.03, 3, "0 / 1 / 2"]
    df.to_csv(changed := tmp_path / "paper.csv", index=False)
    line = next(x for x in readme.answer_table(changed).splitlines() if x.startswith("| 32 | gTop-k |"))
    assert "| 3 (0 / 1 / 2) |" in line and "| 2.1 (1.0-3.0) |" in line
    assert line not in readme.answer_table()


def test_size_first_command_and_no_commit_hash():
    assert len(TEXT.encode()) <= 8 * 1024
    first = next(i for i, line in enumerate(TEXT.splitlines(), 1) if line.startswith("make ") or line == "```bash")
    assert first <= 40
    words = re.findall(r"\b[0-9a-f]{7,40}\b", TEXT)
    assert not [w for w in words if re.search(r"[a-f]", w) and re.search(r"\d", w)]


def test_every_local_link_exists():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", TEXT)
    missing = [x for x in links if not x.startswith("http") and not (ROOT / x).exists()]
    assert not missing
