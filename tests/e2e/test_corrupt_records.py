"""No record on disk can stop a job or an analysis (property test, ``make test``).

Two small simulated training runs (dense and gTop-k, finished) and one interrupted one are
made once; then, for each of a few seeds, a copy of them has every record file corrupted at
random: truncated, random bytes, NULs, a non-UTF-8 byte, JSON of the wrong shape, a field of
the wrong type, a huge number. Each job re-run with its own settings must finish (skipped,
resumed or run again), and the analyses (Fig. 5, Fig. 5 at scale, the payoff) must finish
with warnings, never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.procs import run, simulated_train

TRAIN = [o for o in simulated_train(nodes=2, epochs=2, train_size=64, test_size=16) if not o.startswith("reducer=")]
RECORDS = ("summary.json", "identity.json", "attempts.jsonl", "epochs.jsonl", "failed.json")


def _json_line(rng: random.Random, text: str) -> str:
    """A line of ``text`` (JSON lines, or one JSON object) made wrong in a JSON way."""
    lines = text.splitlines() or ["{}"]
    i = rng.randrange(len(lines))
    try:
        row = json.loads(lines[i])
    except ValueError:
        row = {}
    if isinstance(row, dict) and row:
        key = rng.choice(sorted(row))
        row[key] = rng.choice(["x", True, [1, 2], {"a": 1}, 10**400, -(10**30), None])
        lines[i] = json.dumps(row)
    else:
        lines[i] = rng.choice(["null", "[1, 2]", '"text"', "3"])
    return "\n".join(lines) + "\n"


def corrupt(path: Path, rng: random.Random) -> str:
    """Corrupt ``path`` one random way; returns which."""
    data = path.read_bytes()
    how = rng.choice(["truncate", "random", "nul", "utf8", "shape", "types", "huge"])
    if how == "truncate":
        data = data[: rng.randrange(max(1, len(data)))]
    elif how == "random":
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    elif how == "nul":
        at = rng.randrange(max(1, len(data)))
        data = data[:at] + b"\0" * rng.randrange(1, 50) + data[at:]
    elif how == "utf8":
        at = rng.randrange(max(1, len(data)))
        data = data[:at] + b"\xff\xfe" + data[at:]
    elif how == "shape":
        data = rng.choice([b"null\n", b"[1, 2]\n", b'"a string"\n', b"42\n"]) + data
    elif how in ("types", "huge"):
        data = _json_line(rng, data.decode(errors="replace")).encode()
        if how == "huge":
            data = data.replace(b"0.", b"1e999", 1)
    path.write_bytes(data)
    return how


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("records")
    done = run("-m", *TRAIN, "reducer=dense,gtopk", f"hydra.sweep.dir={root / 'sweep'}")
    assert done.returncode == 0, done.stderr[-3000:]
    stopped_at = [*TRAIN, "reducer=gtopk", "seed=1", "fault.rank=1", "fault.at_iter=3"]
    stopped = run(*stopped_at, f"hydra.run.dir={root / 'stopped'}", "fault.kind=raise")
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    return root


def jobs(root: Path) -> list[tuple[Path, list[str]]]:
    """Each run folder of ``root`` and the overrides that made it (``.hydra/overrides.yaml``),
    less the fault."""
    folders = [d for d in sorted((root / "sweep").iterdir()) if d.is_dir()] + [root / "stopped"]
    out = []
    for d in folders:
        given = OmegaConf.load(d / ".hydra" / "overrides.yaml")
        out.append((d, [o for o in given if not o.startswith(("fault.", "hydra."))]))
    return out


def analyses(root: Path) -> list[list[str]]:
    out = str(root / "analysis")
    return [
        ["analysis.figures.fig5", str(root / "sweep"), str(root / "stopped"), "--out", out],
        ["analysis.figures.scale", str(root / "sweep"), str(root / "stopped"), "--out", out],
        ["analysis.payoff", str(root / "sweep"), "--network", "paper", "--out", out],
    ]


def run_analysis(argv: list[str]) -> str:
    """``python -m argv[0] argv[1:]`` in this process: a one-line exit is fine, a traceback is not."""
    import importlib

    module = importlib.import_module(argv[0] if argv[0] != "analysis.payoff" else "analysis.payoff.cli")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            module.main(argv[1:])
        except SystemExit as e:
            assert e.code in (0, None) or (isinstance(e.code, str) and "\n" not in e.code), e.code
    return err.getvalue()


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in range(1, 6))])
def test_no_corrupt_record_stops_a_job_or_an_analysis(runs, tmp_path, seed):
    rng = random.Random(seed)
    root = tmp_path / "copy"
    shutil.copytree(runs, root)
    done = []
    for d, _ in jobs(root):
        for p in sorted(d.iterdir()):
            if p.name in RECORDS or (p.name.startswith("iters.rank") and p.suffix == ".jsonl"):
                done.append(f"{p.relative_to(root)}: {corrupt(p, rng)}")
    for argv in analyses(root):
        run_analysis(argv)
    for d, overrides in jobs(root):
        again = run(*overrides, f"hydra.run.dir='{d}'")
        assert again.returncode == 0, "\n".join(done) + "\n" + again.stderr[-3000:]
        assert "Traceback" not in again.stderr, again.stderr[-3000:]
        assert (d / "summary.json").exists()
    for argv in analyses(root):
        run_analysis(argv)
