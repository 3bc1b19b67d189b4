"""Table IV: scaling efficiency at each P per reducer, and the speedups of gTop-k over
dense, Top-k and DDP, over the stronger baselines DDP-fp16 and PowerSGD (torch's hooks, when
their runs exist: ``make reproduce-fig6-baselines``), and of Top-k and dense over DDP (the
baseline a user would pick instead; ratios of throughput, hence of efficiency), beside the paper's.

    python -m analysis.figures.table4 runs/fig6_reproduce --network runs/fig6_reproduce/net/emulated/profile.json

Rows: model, P and ``kind``: measured (this machine's runs), modelled (the calibrated
model, see ``analysis.scaling``) and paper (throughput.csv). Writes table4.csv and
table4.md into ``<first root>/analysis/`` (or --out).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.common import model_rank, ordered, out_dir, parser, save
from analysis.figures.fig6 import add_model_args, compute
from analysis.scaling import paper_efficiency

KIND_ORDER = {"measured": 0, "modelled": 1, "paper": 2}
ROW = ["model", "cluster", "compute", "nodes", "kind"]


def speedup_pairs(text: str) -> list[tuple[str, str]]:
    """``"gtopk/dense,gtopk/topk"`` -> [("gtopk", "dense"), ("gtopk", "topk")]."""
    pairs = []
    for item in text.split(","):
        num, _, den = item.strip().partition("/")
        if not num or not den:
            raise ValueError(f"--speedups item {item!r} is not NUMERATOR/DENOMINATOR, e.g. gtopk/dense")
        pairs.append((num, den))
    return pairs


def table(eff: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """One row per (model, setup, P, kind): e(P) per reducer and the speedups."""
    eff = eff.copy()
    for col in ("cluster", "compute"):
        eff[col] = eff[col].fillna("-") if col in eff else "-"
    wide = eff.pivot_table(index=ROW, columns="reducer", values="efficiency", aggfunc="median")
    reducers = ordered(wide.columns)
    out = wide[reducers].rename(columns={r: f"e_{r}" for r in reducers})
    for num, den in pairs:
        if num in wide and den in wide:
            out[f"{num}/{den}"] = wide[num] / wide[den]
        else:
            out[f"{num}/{den}"] = float("nan")
    out = out.reset_index()
    out["_k"] = out["kind"].map(KIND_ORDER).fillna(9)
    out["_m"] = out["model"].map(model_rank)  # the paper's model order
    return out.sort_values(["_m", "nodes", "_k", "cluster"]).drop(columns=["_k", "_m"]).reset_index(drop=True)


def markdown(df: pd.DataFrame) -> str:
    """The table as GitHub markdown (numbers to 3 decimals, blanks for missing)."""

    def cell(v) -> str:
        if isinstance(v, float):
            return "" if v != v else f"{v:.3f}"
        return str(v)

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument(
        "--speedups",
        default="gtopk/dense,gtopk/topk,gtopk/ddp,gtopk/ddp_fp16,gtopk/powersgd,topk/ddp,dense/ddp",
        help="comma-separated NUMERATOR/DENOMINATOR reducer pairs",
    )
    args = ap.parse_args(argv)
    eff = compute(args)
    ref = paper_efficiency(eff["model"].unique()).assign(cluster="paper", compute="P102-100")
    t = table(pd.concat([eff, ref], ignore_index=True), speedup_pairs(args.speedups))
    folder = out_dir(args.roots, args.out)
    save(None, t, folder, "table4")
    md = Path(folder) / "table4.md"
    md.write_text(markdown(t))
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
