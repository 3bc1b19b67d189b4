"""The ``make reproduce-*`` targets: run the experiments, then the analysis scripts.

python -m analysis.reproduce fig6|table4|breakdown|scaling [--full] [--netbench "K=V ..."] [--variants K=V,...] [HYDRA OVERRIDES...]
python -m analysis.reproduce fig5 [--full] [--data digits|fashion] [HYDRA OVERRIDES...]
python -m analysis.reproduce validate [--full] [--netbench "K=V ..."] [HYDRA OVERRIDES...]
python -m analysis.reproduce scale [HYDRA OVERRIDES...]
python -m analysis.reproduce paper_length [HYDRA OVERRIDES...]
"""

from __future__ import annotations

import argparse
import shlex

from analysis.reproduce.at_scale import paper_length, scale
from analysis.reproduce.convergence import fig5
from analysis.reproduce.timing import SCALING_SCRIPTS, VARIANTS, scaling
from analysis.reproduce.validation import validate


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m analysis.reproduce", description=__doc__.split("\n\n")[0])
    ap.add_argument("target", choices=sorted([*SCALING_SCRIPTS, "fig5", "validate", "scale", "paper_length"]))
    ap.add_argument(
        "--full",
        action="store_true",
        help="fig5: the full variant (P = 4, 16, 32; three densities); scaling targets and validate: also P = 16, 32 "
        "for the models whose ranks fit in memory (analysis.memfit), the rest modelled",
    )
    ap.add_argument(
        "--data",
        choices=["digits", "fashion"],
        default="digits",
        help="fig5: the offline digits (default) or Fashion-MNIST (Debian's dataset-fashion-mnist)",
    )
    ap.add_argument("--netbench", default="", help='extra gtopk.perf.netbench overrides, e.g. "pingpong.reps=3"')
    ap.add_argument(
        "--variants",
        default="",
        help="scaling targets: reducer settings also run as lines of their own, KEY=VALUE,... over the "
        "reducers of the sweep whose yaml has KEY (e.g. "
        + ",".join(f"{k}={v}" for k, v in VARIANTS)
        + ", the sampled threshold; default none: each variant adds a sweep to the target's time)",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the runs")
    args = ap.parse_intermixed_args(argv)
    if args.target == "fig5":
        fig5(args.overrides, args.full, args.data)
    elif args.target == "validate":
        validate(args.overrides, shlex.split(args.netbench), args.full)
    elif args.target == "scale":
        scale(args.overrides)
    elif args.target == "paper_length":
        paper_length(args.overrides)
    else:
        variants = [tuple(v.split("=", 1)) for v in args.variants.split(",") if "=" in v]
        scaling(args.target, args.overrides, shlex.split(args.netbench), variants, args.full)
