"""Table IV: scaling efficiency at each P per reducer, and speedups (ratios of throughput,
hence of efficiency), beside the paper's. By default (``default_pairs``, from what the
reducer classes declare, ``analysis.reducers``): the last method in plot order that is not a
payoff baseline (Ok-Topk where its runs exist, else gTop-k) over every other reducer in the table (dense, Top-k, then DDP and,
when their runs exist, the stronger baselines DDP-fp16 and PowerSGD: ``make
reproduce-fig6-baselines``), and each other such method (Top-k, dense) over the baseline a
user would pick instead (DDP), and a reducer at other settings than its yaml's (the sampled
threshold, labelled ``gtopk selection=sampled``) over the same reducer at the yaml's.

    python -m analysis.figures.table4 runs/fig6_reproduce --network runs/fig6_reproduce/net/emulated/profile.json

Rows: model, P and ``kind``: measured (this machine's runs), modelled (the calibrated
model, see ``analysis.scaling``) and paper (throughput.csv). Writes table4.csv and
table4.md into ``<first root>/analysis/`` (or --out).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.common import model_rank, out_dir, parser, save
from analysis.figures.fig6 import add_model_args, compute
from analysis.reducers import conf_reducers, declared, ordered
from analysis.scaling import paper_efficiency

KIND_ORDER = {"measured": 0, "modelled": 1, "paper": 2}
ROW = ["model", "cluster", "compute", "nodes", "kind"]


def speedup_pairs(text: str) -> list[tuple[str, str]]:
    """``"A/B,A/C"`` -> [("A", "B"), ("A", "C")] (config names of reducers)."""
    pairs = []
    for item in text.split(","):
        num, _, den = item.strip().partition("/")
        if not num or not den:
            raise ValueError(f"--speedups item {item!r} is not NUMERATOR/DENOMINATOR, e.g. {_example()}")
        pairs.append((num, den))
    return pairs


def default_pairs(names) -> list[tuple[str, str]]:
    """The speedups of the table of reducers ``names`` (config names or labels): the last
    non-baseline in plot order at its yaml's settings (the subject) over every other
    (non-baselines, then the payoff baselines, each in plot order); then each other
    non-baseline, last first, over the reference baseline (the payoff baseline whose update
    is the exact average: DDP), when it is among ``names``; then each label at other
    settings (``gtopk selection=sampled``) over its reducer at the yaml's (``gtopk``)."""
    names = ordered(names)
    methods = [n for n in names if not declared(n).payoff_baseline]
    baselines = [n for n in names if declared(n).payoff_baseline]
    if not methods:
        return []
    plain = [n for n in methods if " " not in n]
    subject = plain[-1] if plain else methods[-1]
    others = [n for n in methods if n != subject]
    pairs = [(subject, other) for other in others + baselines]
    ref = next((b for b in baselines if declared(b).exact_average), None)
    pairs += [(m, ref) for m in reversed(others)] if ref else []
    return pairs + [(n, n.split(" ")[0]) for n in names if " " in n and n.split(" ")[0] in names]


def _example() -> str:
    """The first default pair of the reducers of ``conf/reducer``, as NUM/DEN."""
    pairs = default_pairs(conf_reducers())
    return "/".join(pairs[0]) if pairs else "NUMERATOR/DENOMINATOR"


def table(eff: pd.DataFrame, pairs: list[tuple[str, str]] | None = None) -> pd.DataFrame:
    """One row per (model, setup, P, kind): e(P) per reducer and the speedups (``pairs``,
    default ``default_pairs`` of the reducers in ``eff``)."""
    eff = eff.copy()
    for col in ("cluster", "compute"):
        eff[col] = eff[col].fillna("-") if col in eff else "-"
    wide = eff.pivot_table(index=ROW, columns="reducer", values="efficiency", aggfunc="median")
    reducers = ordered(wide.columns)
    out = wide[reducers].rename(columns={r: f"e_{r}" for r in reducers})
    for num, den in default_pairs(reducers) if pairs is None else pairs:
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
        help="comma-separated NUMERATOR/DENOMINATOR reducer pairs (config names); default: the last "
        "non-baseline reducer in plot order over every other, and the other non-baselines over DDP",
    )
    args = ap.parse_args(argv)
    eff = compute(args)
    ref = paper_efficiency(eff["model"].unique()).assign(cluster="paper", compute="P102-100")
    pairs = speedup_pairs(args.speedups) if args.speedups else None
    t = table(pd.concat([eff, ref], ignore_index=True), pairs)
    folder = out_dir(args.roots, args.out)
    save(None, t, folder, "table4")
    md = Path(folder) / "table4.md"
    md.write_text(markdown(t))
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
