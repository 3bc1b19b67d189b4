"""`make reproduce-fig6` and `make reproduce-table4` end to end with tiny iteration counts:
netbench, gtopk.run.batch (every reducer, DDP's replayed backward included), the analysis
scripts. On the emulated 1 Gbit/s cluster where root and ip/tc exist, else on loopback
(the target's own fallback)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from gtopk.run.cluster.netns import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
TINY = "model=resnet20 nodes=1,2 benchmark.warmup=1 benchmark.iters=1 batch_size=8"
NETBENCH = "pingpong.reps=2 pingpong.sizes=[8,65536,1048576]"


def make(target: str, runs: Path) -> str:
    out = subprocess.run(
        ["make", "-s", "-C", str(ROOT), target, f"ARGS=hydra.sweep.dir={runs} {TINY}", f"NETBENCH_ARGS={NETBENCH}"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_reproduce_fig6_then_table4_smoke(tmp_path):
    runs = tmp_path / "fig6"
    log = make("reproduce-fig6", runs)
    cluster = "emulated" if unavailable_reason() is None else "local"
    assert ("WARNING: cannot emulate" in log) == (cluster == "local")
    assert f"Outputs in {runs / 'analysis'}" in log
    for name in ("fig6.png", "fig6.pdf", "fig6.csv", "commmodel.png", "commmodel.csv"):
        assert (runs / "analysis" / name).stat().st_size > 0
    fig6 = pd.read_csv(runs / "analysis" / "fig6.csv")
    ours = fig6[fig6["kind"] != "paper"]
    assert set(ours["cluster"]) == {cluster} and set(ours["compute"]) == {"replay"}
    measured = ours[ours["kind"] == "measured"]
    assert set(zip(measured["reducer"], measured["nodes"])) == {
        (r, p) for r in ("dense", "topk", "gtopk", "ddp") for p in (1, 2)
    }
    assert set(ours[ours["kind"] == "modelled"]["nodes"]) == {1, 2, 16, 32}
    assert measured.set_index(["reducer", "nodes"]).loc[("ddp", 1), "efficiency"] == pytest.approx(1.0)  # v_1

    log = make("reproduce-table4", runs)  # the same runs: nothing measured again
    assert "0 jobs to run" in log and "gtopk.perf.netbench" not in log
    table = pd.read_csv(runs / "analysis" / "table4.csv")
    row = table[(table["kind"] == "measured") & (table["nodes"] == 2)].iloc[0]
    assert row["gtopk/dense"] == pytest.approx(row["e_gtopk"] / row["e_dense"])
    assert (runs / "analysis" / "table4.md").exists()
