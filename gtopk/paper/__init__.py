"""The paper's published numbers (Shi et al., ICDCS 2019), for side-by-side display and for
the ``p102`` compute profile: ``throughput.csv`` (images/s per worker by model, reducer and
P, Fig. 6 / Table IV) and ``breakdown.csv`` (t_compute, t_compr, t_commu of gTop-k at 32
nodes). Nothing of ours is fitted or tuned to them."""

from __future__ import annotations

import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
THROUGHPUT = HERE / "throughput.csv"
BREAKDOWN = HERE / "breakdown.csv"


def rows(path: Path) -> list[dict]:
    """The CSV's rows, numbers converted (int where integral, else float)."""

    def num(v: str):
        try:
            f = float(v)
        except ValueError:
            return v
        return int(f) if f.is_integer() and "." not in v else f

    with open(path, newline="") as f:
        return [{k: num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def single_node_throughput() -> dict[str, float]:
    """Images/s of one P102-100 per model (the paper's P = 1 measurement)."""
    return {r["model"]: float(r["images_per_s_per_worker"]) for r in rows(THROUGHPUT) if r["nodes"] == 1}
