"""``data=digits``: scikit-learn's copy of the UCI digits, read without a download, split,
upscaled and normalised as documented (gtopk/train/data/digits.py, docs/data.md), augmented
by translation only, and learnable: a short real training run lowers the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gtopk.train.data import DataError, Digits, build_loader, digits
from gtopk.train.models import ResNet20
from tests.sgd import train_losses


def test_the_file_read_is_what_load_digits_returns():
    from sklearn.datasets import load_digits

    images, labels = digits.load()
    ref = load_digits()
    assert np.array_equal(images, ref.images) and np.array_equal(labels, ref.target)


@pytest.mark.parametrize("size", [32, 16])
def test_splits_shapes_and_normalisation(size):
    train, test = Digits(image_size=size).datasets()
    assert len(train) == 1437 and len(test) == 360
    assert train.images.shape == (1437, 1, size, size) and test.images.shape == (360, 1, size, size)
    assert train.labels.dtype == torch.int64 and set(train.labels.tolist()) == set(range(10))
    assert min(torch.bincount(train.labels).tolist()) >= 141 and min(torch.bincount(test.labels).tolist()) >= 33
    mean, std = train.images.mean().item(), train.images.std().item()
    assert abs(mean) < 1e-5 and abs(std - 1) < 1e-5
    colour, _ = Digits(image_size=size, channels=3).datasets()  # for models fixed at 3 channels
    assert colour.images.shape == (1437, 3, size, size) and torch.equal(colour.images[:, 2], train.images[:, 0])
    _, labels = digits.load()  # the split is the file's order: first 1,437, last 360
    assert torch.equal(test.labels, torch.from_numpy(labels[1437:]))


def test_sizes_select_the_first_images_and_keep_the_full_split_statistics():
    full_train, full_test = Digits(image_size=16).datasets()
    train, test = Digits(image_size=16, train_size=100, test_size=20).datasets()
    assert torch.equal(train.images, full_train.images[:100]) and torch.equal(test.labels, full_test.labels[:20])
    assert Digits(train_size=100).check() == 100 and Digits().check() == 1437


@pytest.mark.parametrize(
    "kwargs,setting",
    [
        ({"train_size": 2000}, "data.train_size"),
        ({"test_size": 0}, "data.test_size"),
        ({"image_size": 4}, "data.image_size"),
        ({"channels": 2}, "data.channels"),
    ],
)
def test_bad_sizes_name_the_setting(kwargs, setting):
    with pytest.raises(DataError, match=setting):
        Digits(**kwargs).check()


def test_augmentation_translates_from_the_torch_rng_and_never_flips():
    train, test = Digits(image_size=16).datasets()
    assert train.shift == 2 and test.shift == 0
    torch.manual_seed(3)
    batch = train.__getitems__(list(range(50)))
    torch.manual_seed(3)
    again = train.__getitems__(list(range(50)))
    assert torch.equal(batch.images, again.images)  # determined by the RNG state
    padded = F.pad(train.images, (2, 2, 2, 2), value=train.padded[0, 0, 0, 0].item())
    for n in range(50):  # each image is a window of its padded self, the right way round
        windows = [padded[n, :, dy : dy + 16, dx : dx + 16] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(batch.images[n], w) for w in windows), n
    state = torch.get_rng_state()
    assert torch.equal(test.__getitems__([0, 1]).images, test.images[:2])  # no augmentation, no draws
    assert torch.equal(torch.get_rng_state(), state)


def test_a_short_training_run_lowers_the_loss():
    torch.manual_seed(0)
    train, test = Digits(image_size=16, train_size=480).datasets()
    loader, sampler = build_loader(train, 32, 0, 1, True, 0, 0)
    model = ResNet20(num_classes=10, in_channels=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)

    @torch.no_grad()
    def test_loss() -> float:
        model.eval()
        out = F.cross_entropy(model(test.images), test.labels).item()
        model.train()
        return out

    before = test_loss()
    losses = train_losses(model, opt, loader, sampler, epochs=2)
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert test_loss() < before
