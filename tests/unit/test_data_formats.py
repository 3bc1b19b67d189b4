"""The datasets load from their real on-disk formats (CIFAR-10's pickled batches, an
ImageNet-style image folder), and a missing or corrupt dataset names its path. One
process, no worker."""

from __future__ import annotations

import pytest

from gtopk.train.data import Cifar10, DataError, ImageNet
from tests.datagen import write_cifar10, write_imagefolder


def test_cifar10_and_imagefolder_load_from_real_formats(tmp_path):
    train, test = Cifar10(str(write_cifar10(tmp_path / "c")), verify=False).datasets()
    assert len(train) == 5 * 64 and len(test) == 64
    x, y = train[0]
    assert x.shape == (3, 32, 32) and 0 <= y < 10
    train, val = ImageNet(str(write_imagefolder(tmp_path / "i"))).datasets()
    assert len(train) == 12 and val[0][0].shape == (3, 224, 224)


@pytest.mark.parametrize("size", [8, 16])
def test_cifar10_at_a_smaller_image_size_keeps_the_papers_augmentation_scaled(tmp_path, size):
    source = Cifar10(str(write_cifar10(tmp_path / "c")), verify=False, image_size=size)
    train, test = source.datasets()
    assert train[0][0].shape == (3, size, size) and test[0][0].shape == (3, size, size)
    crop = next(t for t in source.transforms()[0].transforms if type(t).__name__ == "RandomCrop")
    assert crop.padding == size // 8 and any(
        type(t).__name__ == "RandomHorizontalFlip" for t in train.transform.transforms
    )
    assert source.sample_shape() == (3, size, size)
    with pytest.raises(DataError, match="data.image_size=4"):
        Cifar10(str(tmp_path / "c"), verify=False, image_size=4).check()


def test_missing_or_corrupt_data_names_the_path(tmp_path):
    with pytest.raises(DataError, match=str(tmp_path / "cifar-10-batches-py")):
        Cifar10(str(tmp_path)).check()
    with pytest.raises(DataError, match="ImageNet not found"):
        ImageNet(str(tmp_path)).check()
    write_cifar10(tmp_path)
    with pytest.raises(DataError, match="could not be read"):  # MD5 of generated files
        Cifar10(str(tmp_path), verify=True).datasets()
