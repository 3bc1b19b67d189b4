"""analysis.payoff.versus (payoff_versus.{csv,md}) on test_payoff's hand-written records: each
reducer against each payoff baseline per trained P and network, said only across the seeds."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.payoff import cli as payoff
from analysis.payoff import versus
from analysis.payoff.cells import best_rows
from analysis.payoff.itertime import IterTimes, compute_profile, networks
from analysis.training import Target, load_train_runs
from gtopk.perf.netprofile import NetworkProfile
from tests.unit.test_payoff import one, records, run_payoff, train_job  # noqa: F401 - records is a fixture

TARGET = "99 % of dense"


def best_row(reducer: str, P: int, gbps: float, t: float, lo: float, hi: float, **extra) -> dict:
    """A payoff_best.csv row: time to target ``t`` (its seeds' spread ``lo`` .. ``hi``)."""
    cell = {"model": "resnet20", "data": "fashion_mnist", "batch_per_worker": 128 // P, "grad_accum": 1}
    cell.update(nodes=P, network=f"{gbps:g} Gbit/s", compute_profile="p102", target=TARGET, bandwidth_gbps=gbps)
    row = cell | {"reducer": reducer, "status": "reached", "time_to_target": t, "time_min": lo, "time_max": hi}
    return row | {"rho": 0.001, "seeds": 3, "borrowed": False, "t_iter_source": "modelled"} | extra


def test_a_verdict_only_where_it_holds_across_the_seeds():
    best = pd.DataFrame(
        [
            best_row("gtopk", 16, 0.1, 10.0, 9.0, 11.0),
            best_row("ddp", 16, 0.1, 30.0, 28.0, 33.0),  # gTop-k's slowest seed (11) < DDP's fastest (28)
            best_row("powersgd", 16, 0.1, 12.0, 10.5, 13.0, t_iter_source="measured"),  # overlaps 9-11
            best_row("gtopk", 16, 1.0, 10.0, 9.0, 11.0),
            best_row("ddp", 16, 1.0, 5.0, 4.0, 6.0),  # DDP's slowest (6) < gTop-k's fastest (9)
            best_row("topk", 16, 1.0, float("nan"), float("nan"), float("nan"), status="budget-limited"),
            best_row("gtopk", 32, 1.0, 10.0, 9.0, 11.0, borrowed=True),  # borrowed iterations: left out
            best_row("ddp", 32, 1.0, 5.0, 4.0, 6.0, borrowed=True),
        ]
    )
    vs = versus.versus(best).set_index(["reducer", "nodes", "bandwidth_gbps", "baseline"])
    assert len(vs) == 4 and set(vs.index.get_level_values("nodes")) == {16}
    assert (vs.loc[("gtopk", 16, 0.1, "ddp"), "verdict"], vs.loc[("gtopk", 16, 0.1, "ddp"), "ratio"]) == ("sooner", 3)
    near = vs.loc[("gtopk", 16, 0.1, "powersgd")]
    assert (near["verdict"], near["ratio"], near["baseline_t_iter_source"]) == ("within the noise", 1.2, "measured")
    assert (vs.loc[("gtopk", 16, 1.0, "ddp"), "verdict"], vs.loc[("gtopk", 16, 1.0, "ddp"), "ratio"]) == ("later", 0.5)
    assert vs.loc[("topk", 16, 1.0, "ddp"), "verdict"] == "Top-k budget-limited"
    md = versus.markdown(vs.reset_index())
    assert (
        "| 16 | 0.1 Gbit/s | gTop-k | PowerSGD | 1.20x | within the noise (3 / 3 seeds) | modelled / measured |" in md
    )


def test_one_seed_on_either_side_is_a_plain_comparison_and_says_so():
    best = pd.DataFrame(
        [
            best_row("gtopk", 4, 0.1, 10.0, 10.0, 10.0, seeds=1),
            best_row("ddp", 4, 0.1, 30.0, 28.0, 33.0),  # three seeds, all slower than gTop-k's one
            best_row("gtopk", 4, 1.0, 10.0, 9.0, 11.0),
            best_row("ddp", 4, 1.0, 5.0, 5.0, 5.0, seeds=1),  # one seed, faster than gTop-k's three
            best_row("gtopk", 4, 10.0, 10.0, 9.0, 11.0),
            best_row("ddp", 4, 10.0, 10.5, 10.5, 10.5, seeds=1),  # inside gTop-k's spread: no claim made
            best_row("gtopk", 32, 0.1, 10.0, 9.0, 11.0),
            best_row("ddp", 32, 0.1, 30.0, 28.0, 33.0),  # three seeds a side: the plain word
        ]
    )
    vs = versus.versus(best).set_index(["nodes", "bandwidth_gbps"])["verdict"]
    assert vs[(4, 0.1)] == "sooner, one seed: no noise band"
    assert vs[(4, 1.0)] == "later, one seed: no noise band"
    assert vs[(4, 10.0)] == "within the noise"
    assert vs[(32, 0.1)] == "sooner"


def test_times_within_the_level_band_are_level_whatever_the_seeds_say():
    best = pd.DataFrame(
        [
            # dense against DDP: the same runs, so the seeds' spreads separate by microseconds
            best_row("dense", 32, 0.1, 100.0, 99.0, 101.0),
            best_row("ddp", 32, 0.1, 100.09, 99.09, 101.09),
            best_row("dense", 4, 0.1, 100.0, 100.0, 100.0, seeds=1),
            best_row("ddp", 4, 0.1, 99.8, 99.8, 99.8, seeds=1),  # 0.2 % sooner: level too
            best_row("dense", 16, 0.1, 100.0, 100.0, 100.0),
            best_row("ddp", 16, 0.1, 100.6, 100.6, 100.6),  # 0.6 %: outside the band, a verdict
        ]
    )
    vs = versus.versus(best).set_index("nodes")["verdict"]
    assert vs[32] == vs[4] == "level (within 0.5%)"
    assert vs[16] == "sooner"


@pytest.mark.slow
def test_each_reducer_against_each_baseline_across_the_seeds(records):  # noqa: F811
    train_job(records["runs"], "gtopk", 4, curve=[0.45, 0.75, 0.90, 0.915], seed=1)  # 40 iterations; seed 0: 30
    args = payoff.arguments([str(records["runs"]), "--network", str(records["net"]), "--bench", str(records["bench"])])
    nets = networks([NetworkProfile.load(n) for n in args.network])
    runs, _ = load_train_runs([records["runs"]])
    times = IterTimes(args.bench)
    df = payoff.payoff_table(runs, [Target(relative=0.99)], nets, [compute_profile(str(records["local"]))], times)
    vs = versus.versus(best_rows(df))
    vs = vs[(vs["target"] == TARGET) & (vs["baseline"] == "ddp")].set_index(["reducer", "nodes", "network"])
    assert not any(p in (1, 8) for p in vs.index.get_level_values("nodes"))  # trained P only: 2 and 4
    slow, fast = vs.loc[("gtopk", 4, "0.1 Gbit/s")], vs.loc[("gtopk", 4, "10 Gbit/s")]
    ddp, mine = one(df, "ddp", 4, "0.1 Gbit/s"), one(df, "gtopk", 4, "0.1 Gbit/s")
    assert ddp["time_min"] > mine["time_max"]  # test_payoff_seeds: a verdict at 0.1 Gbit/s ...
    assert (slow["verdict"], slow["seeds"]) == ("sooner, one seed: no noise band", 2)  # DDP: dense's one seed
    assert slow["ratio"] == pytest.approx(ddp["time_to_target"] / mine["time_to_target"])
    assert fast["verdict"] == "within the noise"  # ... none at 10 Gbit/s (DDP inside gTop-k's spread)
    assert vs.loc[("gtopk", 4, "1 Gbit/s"), "verdict"] == "sooner, one seed: no noise band"  # ... and at 1 Gbit/s
    assert vs.loc[("topk", 4, "1 Gbit/s"), "verdict"] == "Top-k budget-limited"
    assert vs.loc[("gtopk", 4, "emulated (1 Gbit/s)"), "t_iter_source"] == "measured"  # the P = 4 benchmark job
    assert (slow["t_iter_source"], slow["baseline_t_iter_source"]) == ("modelled", "modelled")
    md = versus.markdown(vs.reset_index())
    assert (
        "| 4 | 0.1 Gbit/s | gTop-k | DDP | " in md
        and "| sooner, one seed: no noise band (2 / 1 seeds) | modelled / modelled |" in md
    )
    assert "| 100 Gbit/s |" not in md  # the sweep's 0.1, 1 and 10 Gbit/s and the calibrated networks


@pytest.mark.slow
def test_make_payoff_writes_the_versus_table(records):  # noqa: F811
    run_payoff(records)
    vs = pd.read_csv(records["out"] / "payoff_versus.csv")
    assert {"ddp"} <= set(vs["baseline"]) and (records["out"] / "payoff_versus.md").stat().st_size > 0


def test_the_map_marks_a_cell_decided_by_a_single_seed():
    from analysis.payoff.maps import cell_text

    def cell(separated: bool, min_seeds: int) -> pd.Series:
        c = {"state": "ok", "fastest": "gtopk", "fastest_rho": 0.001, "speedup": 2.0, "borrowed": False}
        return pd.Series(c | {"separated": separated, "min_seeds": min_seeds})

    assert cell_text(cell(True, 3)) == "gTop-k 0.001\n2x"
    assert cell_text(cell(True, 1)) == "gTop-k 0.001\n2x\n(1 seed)"
    assert cell_text(cell(False, 3)).endswith("\n(noise)")
