"""The UCI handwritten digits that scikit-learn ships (``data=digits``; no download).

``sklearn/datasets/data/digits.csv.gz`` (what ``sklearn.datasets.load_digits`` reads): 1,797
grey 8x8 images with integer pixels 0..16 and their labels 0..9, one row each. It is read
straight from the installed package (``load``; importing ``sklearn.datasets`` costs about
2 s per process), and ``tests/unit/test_digits.py`` checks it against ``load_digits``.

Split (fixed): the first 1,437 rows train, the last 360 test (80/20; 141-146 images of each
class in the training split, 33-37 in the test split). Images are upscaled (bilinear) to
``size`` x ``size``, repeated over 3 channels for the CIFAR models, scaled to [0, 1] and
normalised by the mean and standard deviation of the training split's upscaled pixels.
Augmentation (training only): a random translation by up to ``size // 8`` pixels each way
(zero padding, i.e. background; no flips: a mirrored digit is another symbol or none),
drawn from the process's torch RNG, as torchvision's transforms draw theirs.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from gtopk.train.batch import SyntheticBatch

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


def upscale(images: np.ndarray, size: int) -> Tensor:
    """N x 8 x 8 in 0..16 -> N x 3 x size x size float32 in [0, 1] (bilinear)."""
    x = torch.from_numpy(images).float().div_(16.0).unsqueeze(1)
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.expand(-1, 3, -1, -1).contiguous()


class DigitsDataset(Dataset):
    """Normalised images and labels held in memory; ``shift`` > 0: random translations.

    ``__getitems__`` (DataLoader batches) draws one offset pair per image from the torch
    RNG, in order, and returns the batch already stacked (a ``SyntheticBatch``, which
    ``gtopk.train.batch.collate`` passes on as ``[images, labels]``).
    """

    def __init__(self, images: Tensor, labels: Tensor, mean: Tensor, std: Tensor, shift: int = 0):
        scale = (mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1))
        self.images = images.sub(scale[0]).div_(scale[1])  # N x 3 x S x S
        self.labels = labels
        self.shift = shift
        if shift:  # background (a zero pixel, normalised) around every image
            self.padded = F.pad(images, (shift,) * 4).sub_(scale[0]).div_(scale[1])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        x, y = self.__getitems__([i])
        return x[0], int(y[0])

    def __getitems__(self, indices: list[int]) -> SyntheticBatch:
        index = torch.as_tensor(indices, dtype=torch.int64)
        if not self.shift:
            return SyntheticBatch(self.images[index], self.labels[index])
        size = self.images.shape[-1]
        offsets = torch.randint(0, 2 * self.shift + 1, (len(indices), 2))
        out = torch.empty((len(indices), *self.images.shape[1:]))
        for n, (i, (dy, dx)) in enumerate(zip(indices, offsets.tolist())):
            out[n] = self.padded[i, :, dy : dy + size, dx : dx + size]
        return SyntheticBatch(out, self.labels[index])


def splits(size: int, train_size: int | None, test_size: int | None) -> tuple[DigitsDataset, DigitsDataset]:
    """(train with augmentation, test without), the first ``train_size`` / ``test_size``
    images of each split (None: all); normalised with the full training split's statistics."""
    images, labels = load()
    x, y = upscale(images, size), torch.from_numpy(labels)
    train_x, test_x = x[:TRAIN_ROWS], x[TRAIN_ROWS:]
    mean, std = train_x.mean((0, 2, 3)), train_x.std((0, 2, 3))  # per channel (grey: all equal)
    n_train = TRAIN_ROWS if train_size is None else train_size
    n_test = ROWS - TRAIN_ROWS if test_size is None else test_size
    return (
        DigitsDataset(train_x[:n_train], y[:TRAIN_ROWS][:n_train], mean, std, shift=size // 8),
        DigitsDataset(test_x[:n_test], y[TRAIN_ROWS:][:n_test], mean, std),
    )
