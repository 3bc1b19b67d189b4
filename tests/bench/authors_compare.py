"""``python -m tests.bench.authors_compare``: our tree gTopKAllReduce beside the authors' mpi4py one.

``--authors`` names a checkout of github.com/hclhkbu/gtopkssgd that the user makes; its
functions are imported from there at run time, unchanged. Rank r of both sides starts from
``dense_input(m, r)``; its k = int(density m) largest |value| (ties to the smaller index) enter
the all-reduce. A timed call starts after a barrier; its time is the slowest rank's. Sides:

* ``authors`` (under ``mpirun``, a Python with mpi4py and NumPy): their
  ``allreducer.gtopk_sparse_allreduce``, fed as their caller feeds it (int64 indices in
  ``torch.topk``'s order, float32 values, one ``storage`` dict); ``allreducer.py`` imports
  torch, which the function does not use: where it is missing an empty module stands in.
* ``ours`` (a gloo group on loopback, ``gtopk.run.spawn``; ``--transport``: the rounds' own sockets, ``auto``, or gloo's send/recv, ``backend``): ``GTopKReducer`` (tree, the paper's
  put-back); all-reduce = t_commu of a call with ``align_timing``, selection = t_compr of one
  without (residual add, selection, put-back). With ``--authors`` the same ranks also time
  their selection, ``compression.py``'s ``gTopKCompressor.compress``, in turn.
* ``both``: per m and P, ``--rounds`` times ours then theirs; the table, also in ``table.json``.
  A run writes ``<out>/<stem>.json`` (medians, digests) and ``.npz`` (its first call's result).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

SEED = 31  # rank r draws its vector from PCG64(SEED + r)
ROOT = Path(__file__).resolve().parents[2]


def k_of(m: int, density: float) -> int:
    """Entries per rank: ``max(1, int(density m))``, as ``gtopk.reducers.selection.exact.k_for`` and the
    authors' ``TopKCompressor`` (``int(numel * ratio)``) both count them."""
    return min(m, max(1, int(density * m)))


def dense_input(m: int, rank: int) -> np.ndarray:
    """Local. Rank ``rank``'s dense gradient: m float32 N(0, 1) draws, the same on both sides."""
    return np.random.Generator(np.random.PCG64(SEED + rank)).standard_normal(m, dtype=np.float32)


def topk_input(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Local. The k largest |x|, ties to the smaller index: (ascending int64 indices, values)."""
    mag = np.abs(x)
    thr = np.partition(mag, mag.size - k)[mag.size - k]
    above = np.flatnonzero(mag > thr)
    ties = np.flatnonzero(mag == thr)[: k - above.size]
    idx = np.sort(np.concatenate([above, ties])).astype(np.int64)
    return idx, x[idx]


def digest(idx: np.ndarray, val: np.ndarray) -> str:
    """sha256 of a sparse vector as a set: int64 indices ascending, then their float32 values."""
    order = np.argsort(idx, kind="stable")
    body = idx[order].astype(np.int64).tobytes() + val[order].astype(np.float32).tobytes()
    return hashlib.sha256(body).hexdigest()[:16]


def summary(seconds: list[float]) -> dict:
    ms = [1e3 * s for s in seconds]  # median and quartiles in ms
    q = statistics.quantiles(ms, n=4) if len(ms) > 1 else ms * 3
    return {"median": statistics.median(ms), "q1": q[0], "q3": q[2], "n": len(ms)}


def stub_missing(names: tuple[str, ...]) -> list[str]:
    """An empty module in ``sys.modules`` for each of ``names`` that cannot be imported: those."""
    stubbed = [n for n in names if n not in sys.modules and importlib.util.find_spec(n) is None]
    for n in stubbed:
        sys.modules[n] = types.ModuleType(n)
    return stubbed


def load_authors(path: str):
    """The authors' ``gtopk_sparse_allreduce`` from the checkout at ``path`` (and what was stubbed)."""
    stubbed = stub_missing(("torch",))
    sys.path.insert(0, str(Path(path).resolve()))
    return importlib.import_module("allreducer").gtopk_sparse_allreduce, stubbed


def load_compressor(path: str):
    """The authors' ``gTopKCompressor`` from ``<path>/compression.py`` (imports torch, numpy)."""
    spec = importlib.util.spec_from_file_location("authors_compression", Path(path) / "compression.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gTopKCompressor


def write(out: str, stem: str, info: dict, idx: np.ndarray, val: np.ndarray) -> None:
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, stem + ".npz"), idx=idx, val=val)
    Path(out, stem + ".json").write_text(json.dumps(info, indent=1))


def run_authors(a) -> None:
    """Collective (MPI_COMM_WORLD): every rank calls the authors' gTopKAllReduce ``warmup +
    calls`` times; rank 0 writes the JSON and the first call's result."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, P, m = comm.rank, comm.size, a.m
    fn, stubbed = load_authors(a.authors)
    x = dense_input(m, rank)
    idx, val = topk_input(x, k_of(m, a.density))
    order = np.lexsort((idx, -np.abs(val)))  # torch.topk's order: largest |value| first
    idx, val = idx[order], val[order]
    storage: dict = {}  # their caller keeps one per tensor
    times, first = [], None
    for i in range(a.warmup + a.calls):
        v, ix = val.copy(), idx.copy()  # the function writes into its value array
        comm.Barrier()
        t0 = time.perf_counter()
        values, indexes, _included = fn(comm, v, storage=storage, indexes=ix)
        t1 = time.perf_counter()
        times.append(comm.allreduce(t1 - t0, op=MPI.MAX))
        if i == 0:
            order = np.argsort(np.asarray(indexes, dtype=np.int64))
            first = (np.asarray(indexes, dtype=np.int64)[order], np.asarray(values, dtype=np.float32)[order])
    inputs = comm.gather(digest(*topk_input(x, k_of(m, a.density))), root=0)
    results = comm.gather(digest(*first), root=0)
    if rank == 0:
        info = {"side": "authors", "m": m, "P": P, "k": k_of(m, a.density), "inputs": inputs, "result": results[0]}
        info |= {"ranks_agree": len(set(results)) == 1, "allreduce_ms": summary(times[a.warmup :]), "stubbed": stubbed}
        write(a.out, a.stem, info, *first)


def ours_worker(
    rank: int, P: int, m: int, density: float, warmup: int, calls: int, authors: str | None, transport: str = "auto"
):
    """Collective (gloo): our tree gTopKAllReduce, and with ``authors`` their selection, in turn.
    On rank 0: (timings, input digests, result digests, first result)."""
    import torch
    import torch.distributed as dist

    from gtopk.reducers import GTopKReducer

    x = torch.from_numpy(dense_input(m, rank))
    k = k_of(m, density)
    tree = {"algorithm": "tree", "putback": "index", "transport": transport}
    aligned = GTopKReducer(density, align_timing=True, **tree)  # t_commu
    plain = GTopKReducer(density, **tree)  # t_compr and the call, as in training
    theirs = load_compressor(authors) if authors else None
    cols = ("commu", "compr", "call", "their_selection")
    times: dict[str, list[float]] = {c: [] for c in cols}
    first = None

    def slowest(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    for i in range(warmup + calls):
        aligned.feedback.residual = torch.zeros_like(x)  # the same input every call
        dist.barrier()
        update, rec = aligned.reduce(x)
        got = [rec.t_commu]
        plain.feedback.residual = torch.zeros_like(x)
        dist.barrier()
        t0 = time.perf_counter()
        _, rec = plain.reduce(x)
        got += [rec.t_compr, time.perf_counter() - t0]
        if theirs is not None:
            g = x.clone()
            theirs.residuals["g"] = torch.zeros_like(x)
            dist.barrier()
            t0 = time.perf_counter()
            _, chosen = theirs.compress(g, "g", ratio=density)
            got.append(time.perf_counter() - t0)
        for c, t in zip(cols, slowest(got) if i >= warmup else []):
            times[c].append(t)
        if i == 0:
            fidx = torch.nonzero(update).squeeze(1)
            first = (fidx.numpy().astype(np.int64), (update[fidx] * P).numpy())  # P = 2^n: exact
            want = torch.from_numpy(topk_input(x.numpy(), k)[0])
            if theirs is not None and not torch.equal(chosen.sort().values, want):
                raise RuntimeError(f"rank {rank}: the authors' selection differs from the top-k input")
    every = [None] * P
    dist.all_gather_object(every, (digest(*topk_input(x.numpy(), k)), digest(*first)))
    return (times, [e[0] for e in every], [e[1] for e in every], first) if rank == 0 else None


def run_ours(a) -> None:
    from gtopk.run.spawn import spawn

    args = (a.m, a.density, a.warmup, a.calls, a.authors, a.transport)
    times, inputs, results, first = spawn(ours_worker, a.P, args, timeout=1800)[0]
    info = {
        "side": "ours",
        "transport": a.transport,
        "m": a.m,
        "P": a.P,
        "k": k_of(a.m, a.density),
        "inputs": inputs,
        "result": results[0],
    }
    info |= {"ranks_agree": len(set(results)) == 1, "allreduce_ms": summary(times["commu"])}
    names = {"compr": "selection_ms", "call": "call_ms", "their_selection": "their_selection_ms"}
    info |= {names[c]: summary(ts) for c, ts in times.items() if ts and c in names}
    write(a.out, a.stem, info, *first)


def compare(ours: tuple[np.ndarray, np.ndarray], theirs: tuple[np.ndarray, np.ndarray]) -> str:
    """How two results (ascending indices, values) agree, in words."""
    (ia, va), (ib, vb) = ours, theirs
    if not np.array_equal(ia, ib):
        return f"no: {np.setxor1d(ia, ib).size} indices in one set only"
    same = int(np.sum(va.view(np.uint32) == vb.astype(np.float32).view(np.uint32)))
    if same == ia.size:
        return "yes (bit for bit)"
    diff = float(np.max(np.abs(va.astype(np.float64) - vb.astype(np.float64))))
    return f"indices yes; {ia.size - same} of {ia.size} values differ (max |diff| {diff:.2e})"


def rows(runs: list[dict], result_of) -> list[dict]:
    """Table rows from side JSONs (dicts with 'side', 'm', 'P' and the medians): per (m, P) and part,
    the median over rounds of each side's medians, their range, theirs/ours, and ``compare``."""
    out = []
    for m, P in sorted({(r["m"], r["P"]) for r in runs}):
        ours = [r for r in runs if (r["m"], r["P"]) == (m, P) and r["side"] == "ours"]
        auth = [r for r in runs if (r["m"], r["P"]) == (m, P) and r["side"] == "authors"]
        for part, o_key, t_runs, t_key in (
            ("all-reduce", "allreduce_ms", auth, "allreduce_ms"),
            ("selection", "selection_ms", ours, "their_selection_ms"),
        ):
            o = [r[o_key]["median"] for r in ours if o_key in r]
            t = [r[t_key]["median"] for r in t_runs if t_key in r]
            if not o or not t:
                continue
            row = {"m": m, "P": P, "part": part, "ours": statistics.median(o), "theirs": statistics.median(t)}
            row |= {"ours_range": [min(o), max(o)], "theirs_range": [min(t), max(t)]}
            row["ratio"] = row["theirs"] / row["ours"]
            row["identical"] = compare(result_of(ours[0]), result_of(auth[0])) if part == "all-reduce" and auth else ""
            out.append(row)
    return out


def table(rs: list[dict]) -> str:
    lines = ["| m | P | part | ours ms (rounds) | theirs ms (rounds) | theirs / ours | identical |", "|" + "---|" * 7]
    for r in rs:
        o, t = (f"{r[s]:.2f} ({r[s + '_range'][0]:.2f}-{r[s + '_range'][1]:.2f})" for s in ("ours", "theirs"))
        lines.append(f"| {r['m']:,} | {r['P']} | {r['part']} | {o} | {t} | {r['ratio']:.2f} | {r['identical']} |")
    return "\n".join(lines)


def run_side(a, side: str, m: int, P: int, stem: str) -> dict:
    """One run of one side (ours in this process's workers, theirs under mpirun); its JSON."""
    common = ["--side", side, "--m", str(m), "--density", str(a.density), "--warmup", str(a.warmup)]
    common += ["--calls", str(a.calls), "--authors", a.authors, "--out", a.out, "--stem", stem]
    if side == "ours":
        run_ours(parse(common + ["--P", str(P), "--transport", a.transport]))
    else:
        cmd = [*a.mpirun.split(), "-np", str(P), a.mpi_python, "-m", "tests.bench.authors_compare", *common]
        subprocess.run(cmd, env=os.environ | {"PYTHONPATH": str(ROOT)}, check=True)
    return json.loads(Path(a.out, stem + ".json").read_text()) | {"stem": stem, "load1": os.getloadavg()[0]}


def run_both(a) -> None:
    load0, runs = os.getloadavg(), []
    for m in a.ms:
        for P in a.nodes:
            for rnd in range(a.rounds):
                for side in ("ours", "authors"):
                    runs.append(run_side(a, side, m, P, f"{side}-m{m}-P{P}-r{rnd}"))
                    print(f"{runs[-1]['stem']}: all-reduce {runs[-1]['allreduce_ms']['median']:.3f} ms", flush=True)
    first: dict = {}  # a case's runs start from the same inputs; a side's ranks and rounds agree on the result
    for r in runs:
        case, own = first.setdefault((r["m"], r["P"]), r), first.setdefault((r["m"], r["P"], r["side"]), r)
        if r["inputs"] != case["inputs"] or not r["ranks_agree"] or r["result"] != own["result"]:
            raise RuntimeError(f"{r['stem']}: the inputs, the ranks' results or the rounds' results disagree")
    rs, load = rows(runs, lambda r: tuple(np.load(Path(a.out, r["stem"] + ".npz")).values())), os.getloadavg()
    Path(a.out, "table.json").write_text(json.dumps({"rows": rs, "load": [load0, load], "runs": runs}))
    print(table(rs))
    print(f"load average (1, 5, 15 min) at start {load0}, at end {load}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", choices=("ours", "authors", "both"), default="both")
    ap.add_argument("--authors", help="a checkout of github.com/hclhkbu/gtopkssgd (its allreducer.py, compression.py)")
    ap.add_argument("--m", dest="ms", type=int, nargs="+", default=[269722, 14728266])
    ap.add_argument("--P", dest="nodes", type=int, nargs="+", default=[2, 4, 8], help="powers of two")
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="both: alternations ours, theirs per case")
    ap.add_argument("--out", default="runs/authors_compare")
    ap.add_argument("--stem", default="run", help="ours/authors: the output files' name")
    ap.add_argument("--mpirun", default="mpirun --allow-run-as-root --oversubscribe", help="+ '--mca btl self,tcp'...")
    ap.add_argument("--transport", default="auto", help="ours: the rounds' transport (reducer.transport)")
    ap.add_argument("--mpi-python", default=sys.executable, help="a Python with mpi4py and NumPy")
    a = ap.parse_args(argv)
    a.m, a.P = a.ms[0], a.nodes[0]
    if any(P < 2 or P & (P - 1) for P in a.nodes):
        ap.error("--P: powers of two >= 2 (the authors' tree needs them)")
    if a.side in ("authors", "both") and not a.authors:
        ap.error(f"--side {a.side} needs --authors")
    return a


if __name__ == "__main__":
    args = parse()
    {"ours": run_ours, "authors": run_authors, "both": run_both}[args.side](args)
