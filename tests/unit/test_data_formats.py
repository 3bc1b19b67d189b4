"""The datasets load from their real on-disk formats (CIFAR-10's pickled batches, an
ImageNet-style image folder), and a missing or corrupt dataset names its path. One
process, no worker."""

from __future__ import annotations

import pytest

from gtopk.train.data import Cifar10, DataError, ImageNet
from gtopk.train.datagen import write_cifar10, write_imagefolder


def test_cifar10_and_imagefolder_load_from_real_formats(tmp_path):
    train, test = Cifar10(str(write_cifar10(tmp_path / "c")), verify=False).datasets()
    assert len(train) == 5 * 64 and len(test) == 64
    x, y = train[0]
    assert x.shape == (3, 32, 32) and 0 <= y < 10
    train, val = ImageNet(str(write_imagefolder(tmp_path / "i"))).datasets()
    assert len(train) == 12 and val[0][0].shape == (3, 224, 224)


def test_missing_or_corrupt_data_names_the_path(tmp_path):
    with pytest.raises(DataError, match=str(tmp_path / "cifar-10-batches-py")):
        Cifar10(str(tmp_path)).check()
    with pytest.raises(DataError, match="ImageNet not found"):
        ImageNet(str(tmp_path)).check()
    write_cifar10(tmp_path)
    with pytest.raises(DataError, match="could not be read"):  # MD5 of generated files
        Cifar10(str(tmp_path), verify=True).datasets()
