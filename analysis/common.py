"""What every analysis script shares: its command line, where its outputs go, and how
they are written (PNG + PDF of the figure, the CSV behind it). The reducers' order, colours
and names are ``analysis.reducers``'s (what each reducer class declares)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.load import load_jobs  # noqa: E402

#: the order models appear in: the paper's (Fig. 6, Table IV); others follow, sorted
MODEL_ORDER = ("vgg16", "resnet20", "alexnet", "resnet50")
#: marker per measured reducer line
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def parser(description: str) -> argparse.ArgumentParser:
    """Arguments common to the scripts: run roots, --out, --wandb."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("roots", nargs="+", help="directories holding the runs (e.g. runs/fig6_reproduce)")
    ap.add_argument("--out", help="output folder (default: <first root>/analysis)")
    ap.add_argument(
        "--wandb", metavar="ENTITY/PROJECT", help="also read the runs synced to this wandb project (only when online)"
    )
    ap.add_argument("--wandb-group", help="with --wandb: only this group (experiment name)")
    return ap


def out_dir(roots: Sequence[str], out: str | None) -> Path:
    d = Path(out) if out else Path(roots[0]) / "analysis"
    d.mkdir(parents=True, exist_ok=True)
    return d


def jobs_or_exit(args: argparse.Namespace) -> pd.DataFrame:
    """The finished jobs the arguments name; exits with a message when there are none."""
    jobs = load_jobs(args.roots, args.wandb, args.wandb_group)
    if jobs.empty:
        raise SystemExit(f"no finished jobs (summary.json + config.yaml) under {' '.join(args.roots)}")
    return jobs


def model_rank(name: str) -> tuple[int, str]:
    """Sort key of a model name: the paper's order (``MODEL_ORDER``), then by name."""
    return (MODEL_ORDER.index(name) if name in MODEL_ORDER else len(MODEL_ORDER), name)


def panels(n: int, width: float, height: float) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure of ``n`` panels of ``width`` x ``height`` inches: one row up to 2 panels,
    else rows of 2 (four models: 2 x 2); unused cells are hidden. Axes in reading order."""
    cols = n if n <= 2 else 2
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def save(fig: plt.Figure | None, table: pd.DataFrame, folder: Path, stem: str) -> list[Path]:
    """Write ``stem``.png, .pdf (when there is a figure) and .csv; returns the paths."""
    paths = []
    if fig is not None:
        for ext in ("png", "pdf"):
            p = folder / f"{stem}.{ext}"
            fig.savefig(p, dpi=150, bbox_inches="tight")
            paths.append(p)
        plt.close(fig)
    csv = folder / f"{stem}.csv"
    table.drop(columns=[c for c in table.columns if c.endswith("_cfg")], errors="ignore").to_csv(csv, index=False)
    paths.append(csv)
    for p in paths:
        print(f"wrote {p}")
    return paths
