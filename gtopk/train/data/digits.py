"""The UCI handwritten digits that scikit-learn ships (``data=digits``; no download).

``sklearn/datasets/data/digits.csv.gz`` (what ``sklearn.datasets.load_digits`` reads): 1,797
grey 8x8 images with integer pixels 0..16 and their labels 0..9, one row each. It is read
straight from the installed package (``load``; importing ``sklearn.datasets`` costs about
2 s per process), and ``tests/unit/test_digits.py`` checks it against ``load_digits``.

Split (fixed): the first 1,437 rows train, the last 360 test (80/20; 141-146 images of each
class in the training split, 33-37 in the test split). Images are scaled to [0, 1],
upscaled (bilinear) to ``image_size`` and normalised (``gtopk.train.data.tensors``).
Augmentation (training only): a random translation by up to ``image_size // 8`` pixels each
way; no flips: a mirrored digit is another symbol or none.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch

from gtopk.train.data.base import DataError, DataSource, check_channels, check_image_size, check_subset
from gtopk.train.data.tensors import TensorImages, grey_splits

TRAIN_ROWS = 1437  # the first rows; the remaining 360 are the test split
ROWS = 1797


def csv_path() -> Path:
    """scikit-learn's copy of the data (located without importing scikit-learn)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("scikit-learn is not installed (pip install scikit-learn)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def load() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 images (float64, N x 8 x 8, values 0..16) and labels (int64), in file order."""
    with gzip.open(csv_path()) as f:
        rows = np.loadtxt(f, delimiter=",")
    if rows.shape != (ROWS, 65):
        raise ValueError(f"{csv_path()} holds {rows.shape}, expected ({ROWS}, 65)")
    return rows[:, :64].reshape(-1, 8, 8), rows[:, 64].astype(np.int64)


class Digits(DataSource):
    """The digits as ``channels`` x ``image_size`` x ``image_size`` images (1 channel: the
    grey image; 3: repeated, for models built for colour input); ``train_size`` /
    ``test_size``: the first images of each split only (null: all 1,437 / 360)."""

    name = "digits"

    def __init__(
        self, image_size: int = 32, channels: int = 1, train_size: int | None = None, test_size: int | None = None
    ):
        self.image_size, self.channels = image_size, channels
        self.train_size, self.test_size = train_size, test_size

    def check(self) -> int:
        check_subset("train_size", self.train_size, TRAIN_ROWS)
        check_subset("test_size", self.test_size, ROWS - TRAIN_ROWS)
        check_image_size(self.image_size)
        check_channels(self.channels, (1, 3), "the digits are grey (1), or repeated over 3 for colour models")
        try:
            load()
        except (OSError, ValueError) as e:
            raise DataError(f"the digits data could not be read ({e}). Fix: pip install scikit-learn") from None
        return TRAIN_ROWS if self.train_size is None else self.train_size

    def sample_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    def datasets(self) -> tuple[TensorImages, TensorImages]:
        images, labels = load()
        x = torch.from_numpy(images).float().div_(16.0).unsqueeze(1)  # N x 1 x 8 x 8 in [0, 1]
        y = torch.from_numpy(labels)
        return grey_splits(
            (x[:TRAIN_ROWS], y[:TRAIN_ROWS]),
            (x[TRAIN_ROWS:], y[TRAIN_ROWS:]),
            self.image_size,
            self.channels,
            (self.train_size, self.test_size),
        )
