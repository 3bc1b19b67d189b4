"""compute=replay's gradient (``gtopk.train.compute.ReplayedCompute.replayed``): ``steady``
(conf/compute/replay.yaml's default) is deterministic in (seed, rank, step), new at every
step, partly shared by the ranks, its first step the sum of ``carry`` steps' draws; under
it Ok-Topk's kept thresholds select about k entries per step, where under ``fixed`` (the
same vector every step) they select about a hundred times k (docs/oktopk.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from gtopk.reducers.oktopk import OkTopKReducer
from gtopk.reducers.selection.exact import k_for
from gtopk.train.compute import STRIDE, WINDOW, ProfileError, ReplayedCompute, replay_banks
from gtopk.train.replay_backward import replay_backward

YAML = Path(__file__).resolve().parents[2] / "conf" / "compute" / "replay.yaml"
CPU = torch.device("cpu")


def replay(rank: int, m: int, seed: int = 0, **settings) -> ReplayedCompute:
    """conf/compute/replay.yaml's replay (``settings`` over it), its banks drawn for ``rank``
    as ``prepare`` draws them."""
    cfg = OmegaConf.merge(OmegaConf.load(YAML), settings)
    c = instantiate(cfg)
    c.banks = replay_banks(m, seed, rank, c.grad_scale, CPU, c.gradient_kind, c.shared)
    return c


def gradient(c: ReplayedCompute, step: int, m: int) -> torch.Tensor:
    parts, factor = c.replayed(step, m)
    return torch.stack(parts).sum(0) * factor


def test_the_yaml_replays_the_steady_gradient():
    c = instantiate(OmegaConf.load(YAML))
    assert c.gradient_kind == "steady" and 0.0 < c.shared < 1.0 and c.carry > 1.0


def test_steady_is_a_function_of_seed_rank_and_step():
    m = 5_000
    a, b = replay(1, m), replay(1, m)
    for step in (0, 1, 7):
        assert torch.equal(gradient(a, step, m), gradient(b, step, m))
    assert not torch.equal(gradient(a, 1, m), gradient(a, 2, m))  # a new draw every step
    assert not torch.equal(gradient(a, 1, m), gradient(replay(2, m), 1, m))  # and rank
    assert not torch.equal(gradient(a, 1, m), gradient(replay(1, m, seed=1), 1, m))  # and seed


def test_steady_offsets_differ_for_a_window_of_steps():
    offsets = {(t * STRIDE) % WINDOW for t in range(WINDOW)}
    assert len(offsets) == WINDOW


def test_steady_shares_its_stated_fraction_and_the_first_step_carries():
    m = 200_000
    r0, r1 = replay(0, m), replay(1, m)
    g0, g1 = gradient(r0, 3, m), gradient(r1, 3, m)
    corr = float(torch.corrcoef(torch.stack([g0, g1]))[0, 1])
    assert corr == pytest.approx(r0.shared, abs=0.02)
    ratio = float(gradient(r0, 0, m).var() / g0.var())
    assert ratio == pytest.approx(r0.carry, rel=0.05)


def test_fixed_is_the_same_vector_every_step():
    m = 1_000
    c = replay(0, m, gradient="fixed")
    assert torch.equal(gradient(c, 0, m), gradient(c, 5, m))


@pytest.mark.parametrize("bad", [{"gradient": "other"}, {"shared": 1.5}, {"carry": 0.5}])
def test_bad_settings_name_the_setting(bad):
    with pytest.raises(ProfileError, match=f"compute.{next(iter(bad))}="):
        ReplayedCompute(**bad)


def oktopk_counts(P: int, m: int, density: float, steps: int, **settings) -> list[tuple[float, float]]:
    """Per step: the largest local selection of the P ranks / k, and the entries the update
    writes / k (Ok-Topk, P ranks in one process, each fed its replayed gradient)."""
    k = k_for(density, m)
    comps = [replay(r, m, **settings) for r in range(P)]
    workers = [OkTopKReducer(density) for _ in range(P)]
    out = []
    for step in range(steps):
        update, recs = OkTopKReducer.reduce_group(workers, [gradient(c, step, m) for c in comps])
        out.append((max(r.selected for r in recs) / k, int(torch.count_nonzero(update)) / k))
    return out


def test_oktopk_kept_thresholds_select_about_k_under_the_steady_replay():
    """Steps 1-6 (Fig. 6 times at most six steps after one warm-up): within 4 x k (a short
    training run: 0.8-4.6 k locally after its first exact re-set, docs/oktopk.md)."""
    counts = oktopk_counts(P=4, m=100_000, density=0.002, steps=7)
    assert counts[0] == (1.0, 1.0)  # the exact step
    for local, written in counts[1:]:
        assert 0.25 <= local <= 4.0 and 0.25 <= written <= 4.0


def test_under_the_fixed_replay_they_select_far_more():
    counts = oktopk_counts(P=4, m=100_000, density=0.002, steps=3, gradient="fixed")
    assert all(local > 20 for local, _ in counts[1:])


def test_replay_backward_sums_the_banks_and_applies_the_factor():
    net = nn.Linear(3, 2)
    params = list(net.parameters())
    m = sum(p.numel() for p in params)
    banks = [torch.arange(m, dtype=torch.float32), torch.ones(m)]
    replay_backward(net, net, params, banks, t_compute=0.0, factor=2.0)
    got = torch.cat([p.grad.reshape(-1) for p in params])
    assert torch.equal(got, 2.0 * (banks[0] + banks[1]))


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.unit.test_replay_gradient [--m M ...] [--P P] [--steps N] [--set KEY=VALUE ...]``:
    Ok-Topk's counts per step under conf/compute/replay.yaml's replay (``--set`` over it, e.g.
    gradient=fixed), density 0.001, as docs/oktopk.md quotes them."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[269_722, 14_728_266])  # ResNet-20, VGG-16
    ap.add_argument("--P", type=int, default=4)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--set", nargs="*", default=[], dest="settings", metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    settings = dict(s.split("=", 1) for s in args.settings)
    for m in args.m:
        counts = oktopk_counts(args.P, m, 0.001, args.steps, **settings)
        cells = " ".join(f"{t}: {local:.2f} / {written:.2f}" for t, (local, written) in enumerate(counts))
        print(f"m = {m:,}, P = {args.P}, {settings or 'the yaml'}: step: largest local / k, update / k: {cells}")


if __name__ == "__main__":
    main()
