"""The per-iteration fast paths: synthetic batches served from one tensor generated up front
(``SyntheticDataset.__getitems__``) give the values the per-item generation gives, and the
non-finite check's one-pass sum gives the exact element-wise verdict in every case."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from gtopk.train.data import Synthetic, SyntheticDataset, build_loader
from gtopk.train.faults import NonFiniteGuard, has_nonfinite

SHAPE, CLASSES = (3, 8, 8), 10


def reference_item(seed: int, i: int, shape=SHAPE, classes=CLASSES):
    """Item ``i`` as ``SyntheticDataset.__getitem__`` generated it before the cache."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + i)
    return torch.randn(shape, generator=g), int(torch.randint(classes, (1,), generator=g))


def reference_batch(seed: int, indices, shape=SHAPE, classes=CLASSES):
    return default_collate([reference_item(seed, int(i), shape, classes) for i in indices])


def same_batch(a, b) -> bool:
    return len(a) == len(b) == 2 and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b)
    )


@pytest.mark.parametrize("cache_bytes", [None, 0], ids=["cached", "generated"])
def test_items_equal_the_per_item_generation(cache_bytes):
    ds = SyntheticDataset(SHAPE, CLASSES, 50, seed=3, cache_bytes=cache_bytes)
    assert (ds.images is None) == (cache_bytes == 0)
    for i in (0, 1, 17, 49):
        x, y = ds[i]
        rx, ry = reference_item(3, i)
        assert torch.equal(x, rx) and type(y) is int and y == ry
    assert torch.equal(ds[-1][0], reference_item(3, 49)[0])
    with pytest.raises(IndexError):
        ds[50]
    if ds.images is not None:  # an item is a copy: writing to it leaves the cache alone
        ds[0][0].zero_()
        assert torch.equal(ds[0][0], reference_item(3, 0)[0])


@pytest.mark.parametrize("cache_bytes", [None, 0], ids=["cached", "generated"])
@pytest.mark.parametrize("train", [True, False])
def test_loader_batches_equal_the_per_item_path(cache_bytes, train):
    ds = SyntheticDataset(SHAPE, CLASSES, 70, seed=5, cache_bytes=cache_bytes)
    loader, sampler = build_loader(ds, 16, rank=1, world=2, train=train, seed=0, workers=0)
    indices = list(sampler)
    batches = list(loader)
    assert len(batches) == (2 if train else 3)
    for k, batch in enumerate(batches):
        assert same_batch(batch, reference_batch(5, indices[16 * k : 16 * (k + 1)]))


def test_default_collate_over_getitems_gives_the_same_batches():
    """Any DataLoader (default collate_fn, which builds the batch sample by sample from what
    ``__getitems__`` returns) gets the values of the per-item path."""
    ds = SyntheticDataset(SHAPE, CLASSES, 40, seed=2)
    plain = DataLoader(ds, batch_size=16, shuffle=False)
    for k, batch in enumerate(plain):
        assert same_batch(batch, reference_batch(2, range(16 * k, min(16 * (k + 1), 40))))


def test_loader_workers_give_the_same_batches():
    ds = SyntheticDataset(SHAPE, CLASSES, 64, seed=1)
    loader, sampler = build_loader(ds, 16, rank=0, world=1, train=True, seed=4, workers=2)
    indices = list(sampler)
    for k, batch in enumerate(loader):
        assert same_batch(batch, reference_batch(1, indices[16 * k : 16 * (k + 1)]))


def test_cache_is_bounded():
    """The configured synthetic sets: CIFAR-shaped (ResNet-20, VGG-16) are cached, 48 MiB for
    the 4,096 training items; ImageNet-shaped (2.3 GiB) are generated on access."""
    cifar = Synthetic([3, 32, 32], 10, train_size=4096, test_size=256)
    train, test = cifar.datasets()
    assert train.images.numel() * train.images.element_size() == 4096 * 3 * 32 * 32 * 4
    assert test.images.shape == (256, 3, 32, 32)
    big = SyntheticDataset((3, 224, 224), 1000, 4096)
    assert big.images is None
    batch = DataLoader(big, batch_size=4)._get_iterator()._next_data()
    assert same_batch(batch, reference_batch(0, range(4), (3, 224, 224), 1000))


def exact(grad: torch.Tensor) -> bool:
    """The check as it was: every entry tested."""
    return bool((~torch.isfinite(grad)).any())


def cases() -> dict[str, tuple[torch.Tensor, bool]]:
    """name: (gradient, whether it holds a NaN or an Inf)."""
    g = torch.randn(10_000)
    out = {"finite": (g, False), "empty": (torch.empty(0), False), "float64": (g.double(), False)}
    for name, value in (("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf"))):
        bad = g.clone()
        bad[1234] = value
        out[name] = (bad, True)
    both = g.clone()
    both[3], both[9] = float("inf"), float("-inf")  # the sum is NaN
    out["inf and -inf"] = (both, True)
    # finite entries whose sum overflows to +-inf: the exact check decides (finite)
    out["overflowing sum"] = (torch.full((1000,), 3.0e38), False)
    out["overflowing negative sum"] = (torch.full((1000,), -3.0e38), False)
    out["overflowing float16 sum"] = (torch.full((100,), 60000.0, dtype=torch.float16), False)
    huge_nan = torch.full((1000,), 3.0e38)
    huge_nan[500] = float("nan")
    out["overflowing sum and nan"] = (huge_nan, True)
    return out


@pytest.mark.parametrize("name", list(cases()))
def test_nonfinite_fast_path_equals_the_exact_check(name):
    grad, expected = cases()[name]
    assert exact(grad) is expected  # the case is what it says
    assert has_nonfinite(grad) is expected
    assert NonFiniteGuard("stop", 0, 1).check(grad) == ([0] if expected else [])


def test_finite_gradient_takes_the_one_pass_path(monkeypatch):
    """A finite gradient whose sum is finite is settled by the sum alone: isfinite runs on
    one element, never on the whole gradient."""
    sizes = []
    real = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: sizes.append(t.numel()) or real(t))
    assert has_nonfinite(torch.randn(10_000)) is False
    assert sizes == [1]
    sizes.clear()
    assert has_nonfinite(torch.full((1000,), 3.0e38)) is False  # overflow: the exact check too
    assert sizes == [1, 1000]
