"""Fashion-MNIST (``data=fashion_mnist``; no download): Zalando's 70,000 grey 28x28
photographs of clothing, shoes and bags in 10 classes (MIT licence), as the four IDX files
that Debian's package ``dataset-fashion-mnist`` installs under
``/usr/share/datasets/fashion-mnist/`` (gzipped; uncompressed files are read as well).

The files are parsed by torchvision's IDX readers (``torchvision.datasets.mnist.
read_image_file`` / ``read_label_file``), which take an uncompressed path: a gzipped file is
first written out uncompressed to a temporary folder, read, and deleted.

Split: the files' own, 60,000 training and 10,000 test images. Images are scaled to [0, 1],
resized once at load to ``image_size`` (bilinear, antialiased when shrinking) and
normalised (``gtopk.train.data.tensors``). Augmentation (training only): a random
translation by up to ``image_size // 8`` pixels each way and a horizontal flip with
probability 1/2 (a mirrored garment is the same garment).
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

from torch import Tensor

from gtopk.train.data.base import DataError, DataSource, check_channels, check_image_size, check_subset
from gtopk.train.data.tensors import TensorImages, grey_splits

PACKAGE = "dataset-fashion-mnist"  # the Debian package that installs the files
ROOT = "/usr/share/datasets/fashion-mnist"
SPLITS = {"train": "train", "test": "t10k"}  # split -> the files' prefix
NATIVE = 28


def idx_path(root: Path, split: str, kind: str) -> Path | None:
    """The IDX file of ``split`` (train/test) and ``kind`` (images/labels) under ``root``,
    gzipped or not (None: neither is there)."""
    base = f"{SPLITS[split]}-{kind}-{'idx3' if kind == 'images' else 'idx1'}-ubyte"
    for name in (f"{base}.gz", base):
        if (root / name).is_file():
            return root / name
    return None


def read_idx(path: Path, kind: str) -> Tensor:
    """An IDX file through torchvision's reader: images uint8 N x H x W, labels int64 N."""
    from torchvision.datasets.mnist import read_image_file, read_label_file

    reader = read_image_file if kind == "images" else read_label_file
    if path.suffix != ".gz":
        return reader(str(path))
    with tempfile.TemporaryDirectory(prefix="gtopk-idx-") as tmp:
        plain = Path(tmp) / path.stem
        with gzip.open(path) as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return reader(str(plain))


def load(root: Path, split: str) -> tuple[Tensor, Tensor]:
    """(images uint8 N x H x W, labels int64 N) of one split; DataError if a file is
    missing or malformed."""
    paths = {kind: idx_path(root, split, kind) for kind in ("images", "labels")}
    if None in paths.values():
        raise DataError(missing_message(root))
    try:
        images, labels = read_idx(paths["images"], "images"), read_idx(paths["labels"], "labels")
    except (OSError, EOFError, ValueError, TypeError, AssertionError, RuntimeError) as e:
        raise DataError(
            f"Fashion-MNIST under {root} could not be read ({e}). Fix: reinstall it "
            f"(apt-get install --reinstall {PACKAGE}), or point data.root= at intact IDX files."
        ) from None
    if len(images) != len(labels) or labels.min() < 0 or labels.max() > 9:
        raise DataError(
            f"Fashion-MNIST under {root}: the {split} split holds {len(images)} images but {len(labels)} labels "
            f"(or labels outside 0..9). Fix: reinstall it (apt-get install --reinstall {PACKAGE})."
        )
    return images, labels


def missing_message(root: Path) -> str:
    names = ", ".join(
        f"{SPLITS[s]}-{k}-{'idx3' if k == 'images' else 'idx1'}-ubyte[.gz]"
        for s in SPLITS
        for k in ("images", "labels")
    )
    return (
        f"Fashion-MNIST not found: looked for {names} in {root}. Fix: install the Debian package "
        f"{PACKAGE} (apt-get install {PACKAGE}; make setup does it as root), or pass data.root= "
        "the folder that holds these four files."
    )


class FashionMNIST(DataSource):
    """Fashion-MNIST as ``channels`` x ``image_size`` x ``image_size`` images (1: grey; 3:
    repeated, for models built for colour input); ``train_size`` / ``test_size``: the first
    images of each split only (null: all 60,000 / 10,000)."""

    name = "fashion_mnist"

    def __init__(
        self,
        root: str = ROOT,
        image_size: int = NATIVE,
        channels: int = 1,
        train_size: int | None = None,
        test_size: int | None = None,
    ):
        self.root = Path(root).expanduser()
        self.image_size, self.channels = image_size, channels
        self.train_size, self.test_size = train_size, test_size

    def check(self) -> int:
        """The settings, then both splits read whole (about a second)."""
        check_image_size(self.image_size, example=NATIVE)
        check_channels(self.channels, (1, 3), "Fashion-MNIST is grey (1), or repeated over 3 for colour models")
        if any(idx_path(self.root, s, k) is None for s in SPLITS for k in ("images", "labels")):
            raise DataError(missing_message(self.root))
        counts = {split: len(load(self.root, split)[1]) for split in SPLITS}
        check_subset("train_size", self.train_size, counts["train"])
        check_subset("test_size", self.test_size, counts["test"])
        return counts["train"] if self.train_size is None else self.train_size

    def sample_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    def datasets(self) -> tuple[TensorImages, TensorImages]:
        splits = []
        for split in SPLITS:
            images, labels = load(self.root, split)
            splits.append((images.unsqueeze(1).float().div_(255.0), labels))
        return grey_splits(
            splits[0], splits[1], self.image_size, self.channels, (self.train_size, self.test_size), flip=True
        )
