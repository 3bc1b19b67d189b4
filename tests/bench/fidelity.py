"""Whether the dilated emulated cluster measures what a cluster of P nodes would: the three
checks of docs/cluster.md (section "Checks that the testbed is faithful"), run as Fig. 6's
jobs (``experiment=fig6_reproduce``: 1 Gbit/s, the paper's compute replayed) and printed.

    python -m tests.bench.fidelity [--models vgg16 resnet20] [--nodes 2 8] [--dilation 8] [--out runs/fidelity]

1. **plain**: at P = 2, t_iter of the plain cluster (``cluster.dilation=1``) and of the
   dilated one (``cluster.dilation=D``) within 10 % of each other, for every model and
   reducer (the plain one measures the machine as it is: on a busy machine its CPU work
   waits for the cores, and the check fails there).
2. **rest**: at every P > 1, the step's local work (``t_local``: data, selection and
   residual, the update) within 20 % of its value at P = 1, both dilated by D;
   ``t_rest`` (also the non-finite check, whose flag all-reduce is a collective that waits
   for the slowest rank) is shown beside it.
3. **wire**: dense's all-reduce (``t_commu_last_arrival``: the rank that entered it last,
   no skew) within 10 % of the wire formula (ring all-reduce per bucket at the link rate,
   no latency) at every P > 1 measured, dilated: counted on the frames that carry the
   gradient (``wire_seconds``: 1514 bytes on the link per 1448 of payload at MTU 1500, what
   the shaper counts and any Ethernet carries, +4.6 %); on the payload alone, shown beside it.

Every job runs at the same D (the P = 1 and P = 2 jobs too, where ``auto`` would give 1):
a D larger than nodes x threads / cores leaves cores to the machine's other work. The
P = 1 jobs time ``ALONE_ITERS`` steps, as many samples as the P = 8 jobs' ranks give. Exit
status 1 when a check fails (one of those not only shown). ``measure`` and ``checks`` are what the slow tests use.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gtopk.reducers.costmodel import Network

ROOT = Path(__file__).resolve().parents[3]
REDUCERS = ("gtopk", "dense")
TOLERANCE = {"plain": 0.10, "rest": 0.20, "wire": 0.10}


@dataclass(frozen=True)
class Check:
    """One comparison: ``measured`` against ``reference`` (seconds), within ``tolerance``."""

    check: str
    case: str
    measured: float
    reference: float
    tolerance: float
    asserted: bool = True  # False: shown beside the checks (t_rest, the payload-only wire time)

    @property
    def ratio(self) -> float:
        return self.measured / self.reference if self.reference > 0 else float("inf")

    @property
    def ok(self) -> bool:
        return abs(self.ratio - 1.0) <= self.tolerance


def sweep(out: Path, overrides: list[str]) -> None:
    """``run.py -m experiment=fig6_reproduce`` with ``overrides`` into ``out`` (raises
    CalledProcessError when a job fails)."""
    cmd = [sys.executable, "run.py", "-m", "experiment=fig6_reproduce", "name=fidelity", "logger.wandb=false"]
    subprocess.run([*cmd, f"hydra.sweep.dir={out}", *overrides], cwd=ROOT, check=True)


#: timed steps of the P = 1 jobs (one rank: the references get as many samples as the P = 8 jobs' 8 x 6)
ALONE_ITERS = 48


def measure(out: Path, models: list[str], nodes: list[int], dilation: int) -> list[dict]:
    """The jobs the checks need, under ``out``: ``nodes`` and P = 1 (``ALONE_ITERS`` timed
    steps) at ``dilation``, P = 2 plain; each model with gTop-k and dense. Returns every
    finished job's summary."""
    common = [f"model={','.join(models)}", f"reducer={','.join(REDUCERS)}", f"cluster.dilation={dilation}"]
    sweep(out, [*common, f"nodes={','.join(map(str, sorted(nodes)))}"])
    sweep(out, [*common, "nodes=1", f"benchmark.iters={ALONE_ITERS}", "benchmark.budget_s=null"])
    if 2 in nodes and dilation > 1:
        sweep(out, [*common[:2], "nodes=2", "cluster.dilation=1"])
    return summaries(out)


def summaries(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(out).glob("*/summary.json"))]


def _key(s: dict) -> tuple:
    return s["model"], s["reducer"], int(s["nodes"]), int(s.get("dilation", 1))


#: bytes of TCP, IPv4 and Ethernet headers on a segment (20 + 20 + 12 of timestamps + 14):
#: a frame of MTU + 14 bytes (what tbf counts) carries MTU - 52 bytes of payload
TCP_IP, ETHERNET = 52, 14


def wire_seconds(s: dict, framed: bool = True) -> float:
    """Dense's ring all-reduce of the job's gradient at its link rate, no latency: its
    payload bytes, or (``framed``) the bytes of the frames that carry them."""
    from gtopk.reducers.dense import DenseReducer

    mtu = int(s.get("mtu") or 1500)
    per_byte = (mtu + ETHERNET) / (mtu - TCP_IP) if framed else 1.0
    net = Network(alpha=0.0, beta=8.0 * per_byte / float(s["bandwidth_bits_per_s"]))
    return DenseReducer.predict_commu(int(s["nodes"]), int(s["params"]), net)


def checks(jobs: list[dict]) -> list[Check]:
    """The three checks over the summaries ``jobs`` (those of ``measure``)."""
    by = {_key(s): s for s in jobs}
    out = []
    for (model, reducer, P, d), s in sorted(by.items()):
        case = f"{model} {reducer} P={P} D={d}"
        plain = by.get((model, reducer, P, 1))
        if P == 2 and d > 1 and plain:
            out.append(Check("plain", f"{case} vs D=1: t_iter", s["t_iter"], plain["t_iter"], TOLERANCE["plain"]))
        alone = by.get((model, reducer, 1, d))
        if P > 1 and d > 1 and alone:
            for field in ("t_local", "t_rest"):
                c = Check(
                    "rest", f"{case} vs P=1: {field}", s[field], alone[field], TOLERANCE["rest"], field == "t_local"
                )
                out.append(c)
        if reducer == "dense" and P > 1 and d > 1:
            measured = s["t_commu_last_arrival"]
            out.append(Check("wire", f"{case}: all-reduce vs framed", measured, wire_seconds(s), TOLERANCE["wire"]))
            nominal = wire_seconds(s, framed=False)
            out.append(Check("wire", f"{case}: all-reduce vs payload", measured, nominal, TOLERANCE["wire"], False))
    return out


def table(found: list[Check]) -> str:
    lines = ["| check | case | measured (ms) | reference (ms) | ratio | within |", "|---|---|---|---|---|---|"]
    for c in found:
        within = f"{'yes' if c.ok else 'NO'} ({c.tolerance:.0%})" + ("" if c.asserted else ", shown only")
        lines.append(
            f"| {c.check} | {c.case} | {c.measured * 1e3:.1f} | {c.reference * 1e3:.1f} | {c.ratio:.3f} | {within} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["vgg16", "resnet20"])
    ap.add_argument("--nodes", nargs="+", type=int, default=[2, 8], help="P > 1 to measure (2 for the plain check)")
    ap.add_argument("--dilation", type=int, default=8, help="D of every dilated job")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "fidelity")
    ap.add_argument("--no-run", action="store_true", help="only check the jobs already under --out")
    args = ap.parse_args(argv)
    if args.dilation < 2 or any(p < 2 for p in args.nodes):
        ap.error("--dilation must be >= 2 and every --nodes >= 2")
    jobs = summaries(args.out) if args.no_run else measure(args.out, args.models, args.nodes, args.dilation)
    found = checks(jobs)
    print(table(found))
    return 0 if found and all(c.ok for c in found if c.asserted) else 1


if __name__ == "__main__":
    raise SystemExit(main())
