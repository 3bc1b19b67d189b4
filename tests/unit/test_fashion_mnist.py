"""``data=fashion_mnist`` on small IDX files the tests write (tests/datagen.py): read
back exactly (gzipped or not), resized and normalised as documented, augmented by
translation and flip from the torch RNG, and a missing or broken file is one line naming
the Debian package and ``data.root=``. (The installed package itself: tests/e2e.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gtopk.train.data import DataError, FashionMNIST
from gtopk.train.data.fashion_mnist import load
from gtopk.train.data.tensors import resize
from tests.datagen import write_fashion_mnist
from tests.sgd import train_losses


@pytest.mark.parametrize("gz", [True, False])
def test_the_idx_files_read_back_as_written(tmp_path, gz):
    written = write_fashion_mnist(tmp_path, train=40, test=12, gz=gz)
    for split in ("train", "test"):
        images, labels = load(tmp_path, split)
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert np.array_equal(images.numpy(), written[(split, "images")])
        assert np.array_equal(labels.numpy(), written[(split, "labels")])
    assert FashionMNIST(str(tmp_path)).check() == 40
    assert FashionMNIST(str(tmp_path), train_size=10).check() == 10


@pytest.mark.parametrize("size,channels", [(28, 1), (14, 1), (16, 3)])
def test_splits_shapes_and_normalisation(tmp_path, size, channels):
    written = write_fashion_mnist(tmp_path, train=40, test=12)
    train, test = FashionMNIST(str(tmp_path), image_size=size, channels=channels).datasets()
    assert train.images.shape == (40, channels, size, size) and test.images.shape == (12, channels, size, size)
    assert torch.equal(test.labels, torch.from_numpy(written[("test", "labels")]).long())
    assert abs(train.images.mean().item()) < 1e-5 and abs(train.images.std().item() - 1) < 1e-4
    if channels == 3:  # grey, the same plane in every channel
        assert torch.equal(train.images[:, 0], train.images[:, 2])
    if size == 28:  # native size: the pixels in [0, 1], less the training mean, over its std
        pixels = written[("train", "images")] / 255.0
        want = (written[("test", "images")] / 255.0 - pixels.mean()) / pixels.std(ddof=1)
        assert np.allclose(test.images[:, 0].numpy(), want, atol=1e-5)


def test_shrinking_averages_the_pixels():
    """28 -> 14 antialiased: a stripe pattern of period 2 becomes its mean, not every other row."""
    stripes = torch.zeros(1, 1, 28, 28)
    stripes[..., ::2, :] = 1.0
    small = resize(stripes, 14)
    assert small.shape == (1, 1, 14, 14)
    assert torch.allclose(small[..., 2:-2, :], torch.full_like(small[..., 2:-2, :], 0.5), atol=0.02)
    assert resize(stripes, 28) is stripes


def test_sizes_select_the_first_images_and_keep_the_full_split_statistics(tmp_path):
    write_fashion_mnist(tmp_path, train=40, test=12)
    full_train, full_test = FashionMNIST(str(tmp_path), image_size=14).datasets()
    train, test = FashionMNIST(str(tmp_path), image_size=14, train_size=10, test_size=5).datasets()
    assert torch.equal(train.images, full_train.images[:10]) and torch.equal(test.images, full_test.images[:5])


def test_augmentation_translates_and_flips_from_the_torch_rng(tmp_path):
    write_fashion_mnist(tmp_path, train=40, test=12)
    train, test = FashionMNIST(str(tmp_path), image_size=16).datasets()
    assert train.shift == 2 and train.flip and test.shift == 0 and not test.flip
    torch.manual_seed(5)
    batch = train.__getitems__(list(range(40)))
    torch.manual_seed(5)
    assert torch.equal(batch.images, train.__getitems__(list(range(40))).images)  # the RNG decides
    flipped = 0
    for n in range(40):  # a window of the padded image, the right way round or mirrored
        windows = [train.padded[n, :, dy : dy + 16, dx : dx + 16] for dy in range(5) for dx in range(5)]
        plain = any(torch.equal(batch.images[n], w) for w in windows)
        mirrored = any(torch.equal(batch.images[n], w.flip(-1)) for w in windows)
        assert plain or mirrored, n
        flipped += mirrored and not plain
    assert 0 < flipped < 40
    state = torch.get_rng_state()
    assert torch.equal(test.__getitems__([0, 1]).images, test.images[:2])  # no augmentation, no draws
    assert torch.equal(torch.get_rng_state(), state)


def test_missing_files_name_the_package_and_data_root(tmp_path):
    with pytest.raises(DataError) as info:
        FashionMNIST(str(tmp_path)).check()
    line = str(info.value)
    assert "\n" not in line and "dataset-fashion-mnist" in line and "data.root=" in line and str(tmp_path) in line
    write_fashion_mnist(tmp_path, train=40, test=12)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        FashionMNIST(str(tmp_path)).check()


def test_a_broken_file_is_one_line(tmp_path):
    write_fashion_mnist(tmp_path, train=40, test=12)
    images = tmp_path / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:200])  # truncated
    with pytest.raises(DataError, match="could not be read.*reinstall"):
        FashionMNIST(str(tmp_path)).check()


@pytest.mark.parametrize(
    "kwargs,setting",
    [
        ({"train_size": 41}, "data.train_size=41"),
        ({"test_size": 0}, "data.test_size=0"),
        ({"image_size": 4}, "data.image_size=4"),
        ({"channels": 2}, "data.channels=2"),
    ],
)
def test_bad_settings_name_the_setting(tmp_path, kwargs, setting):
    write_fashion_mnist(tmp_path, train=40, test=12)
    with pytest.raises(DataError, match=setting):
        FashionMNIST(str(tmp_path), **kwargs).check()


def test_the_one_channel_model_learns_it(tmp_path):
    """ResNet-20 built for 1 channel (as conf/model reads data.channels) lowers the loss."""
    from gtopk.train.data import build_loader
    from gtopk.train.models import ResNet20

    write_fashion_mnist(tmp_path, train=256, test=12)
    torch.manual_seed(0)
    train, _ = FashionMNIST(str(tmp_path), image_size=14).datasets()
    loader, sampler = build_loader(train, 32, 0, 1, True, 0, 0)
    model = ResNet20(in_channels=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = train_losses(model, opt, loader, sampler, epochs=3)
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4
