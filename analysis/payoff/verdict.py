"""The answer of ``analysis.payoff`` per cell and in words: the fastest reducer to the
target in each (setup, density, P, network, compute profile, target), and one verdict line
per (setup, density, network, compute profile, target), from the trained P only (never a
borrowed one), e.g. ``ResNet-20, rho 0.001, 1 Gbit/s, compute p102: gTop-k reaches 99 % of
dense 1.8x sooner than DDP at P = 32; no gain below P = 8``.

With several seeds a cell has a spread of times to target (``time_min`` .. ``time_max``:
the seeds' iterations x t_iter). "X reaches the target sooner than Y" is said only where it
holds across that spread: X's slowest seed is faster than Y's fastest (``time_max`` of X <
``time_min`` of Y); otherwise the two are *within the noise* of the seeds. With one seed the
spread is the single time and the rule is the plain comparison, which no noise band backs:
the line says so (``one seed at P = 4: no noise band``), as the map and ``payoff_versus`` do."""

from __future__ import annotations

import math

import pandas as pd

from analysis.reducers import display, payoff_baselines, reference_baseline, reference_display

MODELS = {"resnet20": "ResNet-20", "vgg16": "VGG-16", "alexnet": "AlexNet", "resnet50": "ResNet-50"}
SETUP = ["model", "data", "batch_per_worker", "grad_accum"]
CELL = SETUP + ["density", "nodes", "network", "compute_profile", "target"]
#: a cell's state when no reducer reaches the target, by priority
STATES = ("budget-limited", "not reached", "no time", "no run")
#: a reducer whose time to target is within this fraction of DDP's is level with it, not a gain
#: (dense against DDP: the same runs, t_iter apart by the bucketing's few microseconds)
LEVEL = 0.005


def no_band(seeds):
    """Whether a comparison with this many seeds on its thinner side (a number or a Series)
    is a plain one, which no noise band backs: one seed."""
    return seeds < 2


def spread(g: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(fastest, slowest) time to target of each row over its seeds (the time itself where
    the table has no spread columns)."""
    t = g["time_to_target"]
    lo = g["time_min"].fillna(t) if "time_min" in g else t
    hi = g["time_max"].fillna(t) if "time_max" in g else t
    return lo, hi


def fastest(df: pd.DataFrame, keys: list[str] | None = None) -> pd.DataFrame:
    """One row per cell (``keys``, default ``CELL``): ``state`` (ok, or the first of
    ``STATES`` any reducer has), ``fastest`` reducer (the least median time; ``fastest_rho``
    its density where the rows carry ``rho``) and its ``speedup`` over DDP (NaN without a
    DDP time), ``separated`` (its slowest seed beats every other reducer's fastest),
    ``runner_up``, ``beats_ddp`` (its slowest seed beats DDP's fastest), ``seeds`` (the most
    any reducer had), ``borrowed`` (iterations from another P), bandwidth and whether
    calibrated, ``min_seeds`` (the fewest any reducer with a time had: 1 = a plain comparison).
    DDP: the reference baseline (``analysis.reducers.reference_baseline``)."""
    keys = CELL if keys is None else keys
    ref = reference_baseline()
    rows = []
    for key, g in df.groupby(keys, sort=True):
        row = dict(zip(keys, key))
        row.update(bandwidth_gbps=g["bandwidth_gbps"].iloc[0], calibrated=bool(g["calibrated"].iloc[0]))
        row["borrowed"] = bool(g["borrowed"].any())
        row["seeds"] = int(g["seeds"].max()) if "seeds" in g and g["seeds"].notna().any() else 1
        ok = g[g["status"] == "reached"].dropna(subset=["time_to_target"])
        if ok.empty:
            row.update(state=next(s for s in STATES if (g["status"] == s).any()), fastest=None, speedup=math.nan)
            rows.append(row)
            continue
        lo, hi = spread(ok)
        row["min_seeds"] = int(ok["seeds"].min()) if "seeds" in ok and ok["seeds"].notna().all() else 1
        i = ok["time_to_target"].idxmin()
        best, others = ok.loc[i], ok.drop(index=i)
        ddp = ok[ok["reducer"] == ref]
        row.update(state="ok", fastest=best["reducer"], speedup=best.get(f"speedup_vs_{ref}", math.nan))
        row.update(time_to_target=best["time_to_target"], separated=others.empty or hi[i] < lo[others.index].min())
        row["runner_up"] = None if others.empty else others.loc[others["time_to_target"].idxmin(), "reducer"]
        row["beats_ddp"] = best["reducer"] != ref and not ddp.empty and hi[i] < lo[ddp.index].min()
        if "rho" in ok:
            row["fastest_rho"] = best["rho"]
        rows.append(row)
    return pd.DataFrame(rows)


def _ps(values) -> str:
    return ", ".join(str(int(p)) for p in values)


def verdict(cells: pd.DataFrame, rows: pd.DataFrame) -> str:
    """One line for the cells (over P) of one setup, density, network, compute and target;
    ``rows`` are payoff.csv's rows of the same."""
    c0 = cells.iloc[0]
    ref, ddp_name = reference_baseline(), reference_display()
    head = f"{MODELS.get(c0['model'], c0['model'])}, rho {c0['density']:g}, {c0['network']}, compute {c0['compute_profile']}: "
    target = c0["target"]
    trained = cells[~cells["borrowed"] & (cells["state"] != "no run")].sort_values("nodes")
    tail = ""
    for status, words in (("budget-limited", "was budget-limited"), ("not reached", "did not reach it")):
        missed = rows[(rows["status"] == status) & ~rows["borrowed"]]
        tail += "".join(
            f"; {display(lab)} {words} at P = {_ps(sorted(set(g['nodes'])))}"
            for lab, g in missed.groupby("reducer", sort=True)
        )
    both = trained[(trained["state"] == "ok") & trained["speedup"].notna()]
    if both.empty:
        states = ", ".join(f"P = {int(c['nodes'])}: {c['state']}" for _, c in trained.iterrows()) or "no trained P"
        return f"{head}no P where {ddp_name} and another reducer both have a time to {target} ({states}){tail}"
    ddp_first = (both["fastest"] == ref) & both["separated"].astype(bool)
    level = ~ddp_first & (both["speedup"] - 1).abs().lt(LEVEL)  # e.g. dense against DDP: the same runs
    gain = both["beats_ddp"].astype(bool) & (both["speedup"] > 1) & ~level
    noise = both[~gain & ~ddp_first & ~level]["nodes"]
    seeds = _seeds(both)
    within = f"; within the noise of the seeds at P = {_ps(noise)}" if len(noise) else ""
    even = f"; level with {ddp_name} (within {LEVEL:.1%}) at P = {_ps(both[level]['nodes'])}" if level.any() else ""
    if not gain.any():
        if not ddp_first.any():
            if not level.any():
                return f"{head}within the noise of the seeds at every trained P ({_ps(both['nodes'])}){seeds}{tail}"
            return f"{head}{(within + even).removeprefix('; ')}{seeds}{tail}"
        return f"{head}{ddp_name} reaches {target} soonest at {_every(both, ddp_first)}{within}{even}{seeds}{tail}"
    best = both[gain].loc[both[gain]["speedup"].idxmax()]
    text = (
        f"{head}{display(best['fastest'])} reaches {target} {times(best['speedup'])} sooner than {ddp_name} "
        f"{against(rows, best['fastest'], int(best['nodes']))}at P = {int(best['nodes'])}"
    )
    losing = both[ddp_first]["nodes"]
    if losing.empty and noise.empty and not level.any():
        text += f"; a gain at every trained P ({_ps(both['nodes'])})"
    elif not losing.empty and losing.max() < both[gain]["nodes"].min():
        text += f"; no gain below P = {int(both[gain]['nodes'].min())}"
    elif not losing.empty:
        text += f"; no gain at P = {_ps(losing)}"
    return text + within + even + seeds + tail


def times(ratio: float) -> str:
    """``2.8x``; ``1.01x`` where one decimal would print a gain as ``1.0x``."""
    text = f"{ratio:.1f}x"
    return f"{ratio:.2f}x" if text == "1.0x" else text


def _seeds(both: pd.DataFrame) -> str:
    """``" (3 seeds)"``, or where a reducer had one seed ``" (up to 3 seeds; one seed at P = 4:
    no noise band)"``: that P's verdict is a plain comparison."""
    most = int(both["seeds"].max())
    single = both.loc[no_band(both["min_seeds"]), "nodes"]  # fastest() sets it on every cell with a time
    if single.empty:
        return f" ({most} seeds)" if most > 1 else ""
    return f" ({f'up to {most} seeds; ' if most > 1 else ''}one seed at P = {_ps(single)}: no noise band)"


def _every(both: pd.DataFrame, mask: pd.Series) -> str:
    if mask.all():
        return f"every trained P ({_ps(both['nodes'])})"
    return f"P = {_ps(both[mask]['nodes'])}"


def against(rows: pd.DataFrame, label: str, P: int) -> str:
    """``"and 1.4x as soon as DDP-fp16 and 0.9x as soon as PowerSGD "``: ``label``'s time to
    target at P against each payoff baseline but the reference one (``analysis.reducers``)
    that has one there (their time / its time; nothing for a baseline without a time there,
    e.g. not trained)."""
    ok = rows[(rows["nodes"] == P) & (rows["status"] == "reached")].dropna(subset=["time_to_target"])
    lo, hi = spread(ok)
    mine = ok[ok["reducer"] == label]
    parts = []
    ref = reference_baseline()
    for other in (b for b in payoff_baselines() if b != ref):
        theirs = ok[ok["reducer"] == other]
        if other != label and not mine.empty and not theirs.empty:
            apart = hi[mine.index].min() < lo[theirs.index].min() or hi[theirs.index].min() < lo[mine.index].min()
            ratio = theirs["time_to_target"].min() / mine["time_to_target"].min()
            parts.append(f"{ratio:.1f}x as soon as {display(other)}" + ("" if apart else " (within the noise)"))
    return "".join(f"and {p} " for p in parts)


def verdicts(df: pd.DataFrame, cells: pd.DataFrame) -> list[tuple[bool, str]]:
    """(calibrated network?, line) per setup, density, network, compute and target."""
    keys = SETUP + ["density", "network", "compute_profile", "target"]
    rows = dict(iter(df.groupby(keys, sort=False)))
    return [(bool(g["calibrated"].iloc[0]), verdict(g, rows[key])) for key, g in cells.groupby(keys, sort=False)]


def best_verdicts(best: pd.DataFrame, cells: pd.DataFrame) -> list[tuple[bool, str]]:
    """The verdict lines of each reducer at its best trained density (``payoff_best.csv``),
    with the density picked per reducer at the P of the verdict, e.g. ``..., best rho:
    gTop-k reaches 99 % of dense 2.1x sooner than DDP ... at P = 4 (rho: gTop-k 0.01, ...)``."""
    keys = SETUP + ["network", "compute_profile", "target"]
    rows = dict(iter(best.groupby(keys, sort=False)))
    out = []
    for key, g in cells.groupby(keys, sort=False):
        r = rows[key]
        line = verdict(g.assign(density=math.nan), r.assign(density=math.nan))
        head, _, rest = line.partition(": ")
        picked = r[r["rho"].notna() & ~r["borrowed"].astype(bool) & (r["status"] != "no run")]
        rhos = "; ".join(
            f"P = {int(p)}: " + ", ".join(f"{display(x['reducer'])} {x['rho']:g}" for _, x in q.iterrows())
            for p, q in picked.drop_duplicates(["reducer", "nodes"]).groupby("nodes", sort=True)
        )
        head = head.replace("rho nan", "best rho")
        out.append((bool(g["calibrated"].iloc[0]), f"{head}: {rest} [rho picked: {rhos}]"))
    return out
