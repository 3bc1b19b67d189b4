"""Fig. 5: convergence, training loss and top-1 test accuracy per epoch, one line per
training run (dense vs gTop-k and Top-k; for the density sensitivity runs, one line per
density rho), one row of panels per model.

    python -m analysis.fig5 runs/fig5_convergence
    python -m analysis.fig5 runs/density_sensitivity --stem density

A run's label is its reducer, with rho when the reducer's config has a density, and the
experiment name when the roots hold several. Epochs of runs still training count.
Writes <stem>.{png,pdf,csv} (default stem fig5) into ``<first root>/analysis/``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from analysis.common import out_dir, parser, save
from analysis.load import load_epochs

METRICS = (("train_loss", "training loss"), ("test_top1", "top-1 test accuracy"))


def label(row: pd.Series, with_name: bool) -> str:
    """reducer [rho=...] [name] [P=...]."""
    text = str(row["reducer"])
    if "density" in (row["reducer_cfg"] or {}):
        text += f" rho={row['density']:g}"
    text += f" P={int(row['nodes'])}"
    return f"{text} [{row['name']}]" if with_name else text


def labelled(epochs: pd.DataFrame) -> pd.DataFrame:
    with_name = epochs["name"].nunique() > 1
    out = epochs.copy()
    out["label"] = [label(r, with_name) for _, r in out.iterrows()]
    return out


def plot(epochs: pd.DataFrame) -> plt.Figure:
    models = sorted(epochs["model"].unique())
    fig, axes = plt.subplots(len(models), len(METRICS), figsize=(5.0 * len(METRICS), 3.4 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        g = epochs[epochs["model"] == model]
        for ax, (metric, title) in zip(row, METRICS):
            for lab, run in g.groupby("label", sort=True):
                run = run.sort_values("epoch")
                ax.plot(run["epoch"], run[metric], marker="o", markersize=3, label=lab)
            ax.set_xlabel("epoch")
            ax.set_ylabel(title)
            ax.set_title(f"{model}: {title}", fontsize=10)
            ax.grid(alpha=0.3)
        row[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--stem", default="fig5", help="output file name stem (default fig5)")
    args = ap.parse_args(argv)
    epochs = load_epochs(args.roots, args.wandb, args.wandb_group)
    if epochs.empty:
        raise SystemExit(f"no training epochs (epochs.jsonl) under {' '.join(args.roots)}")
    epochs = labelled(epochs)
    cols = [
        "name",
        "model",
        "label",
        "reducer",
        "nodes",
        "density",
        "epoch",
        "train_loss",
        "test_loss",
        "test_top1",
        "run_dir",
    ]
    save(plot(epochs), epochs[cols].sort_values(["model", "label", "epoch"]), out_dir(args.roots, args.out), args.stem)


if __name__ == "__main__":
    main()
