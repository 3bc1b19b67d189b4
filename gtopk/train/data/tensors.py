"""Grey image sets held in memory as tensors (the digits, Fashion-MNIST): resized once at
load, normalised, served a batch at a time, augmented from the torch RNG.

* ``resize``: bilinear to ``size`` x ``size`` (antialiased when shrinking, so 28 -> 14
  averages the pixels instead of sampling every other one).
* ``grey_splits``: the (train, test) pair from both splits' pixels in [0, 1], normalised by
  the mean and standard deviation of the full training split after resizing, as
  ``channels`` channels (1: the grey image; 3: the same plane repeated, a view, for models
  built for colour input), each split cut to its first n images if asked.
* ``TensorImages``: the dataset; training augmentation is a random translation by up to
  ``shift`` pixels each way (background padding) and, with ``flip``, a horizontal flip
  with probability 1/2, both drawn from the process's torch RNG as torchvision's
  transforms draw theirs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from gtopk.train.batch import SyntheticBatch


def resize(x: Tensor, size: int) -> Tensor:
    """N x C x H x W float -> N x C x size x size (bilinear; antialiased when shrinking;
    unchanged when already that size)."""
    if x.shape[-2:] == (size, size):
        return x
    shrink = size < min(x.shape[-2:])
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=shrink)


class TensorImages(Dataset):
    """Normalised images (N x C x S x S) and int64 labels in memory.

    ``images`` is what an item holds without augmentation; with ``shift`` > 0 it is a view
    of ``padded`` (the images with ``shift`` pixels of background around them), so the set
    is held once. ``__getitems__`` (DataLoader batches) draws per image, in order, one
    offset pair (``shift`` > 0) and then one flip bit (``flip``), and returns the batch
    already stacked (a ``SyntheticBatch``, passed on by ``gtopk.train.batch.collate``).
    """

    def __init__(self, images: Tensor, labels: Tensor, mean: float, std: float, shift: int = 0, flip: bool = False):
        self.labels, self.shift, self.flip = labels, shift, flip
        if shift:  # background (a zero pixel, normalised) around every image
            self.padded = F.pad(images, (shift,) * 4).sub_(mean).div_(std)
            self.images = self.padded[:, :, shift:-shift, shift:-shift]
        else:
            self.images = (images - mean) / std

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        x, y = self.__getitems__([i])
        return x[0], int(y[0])

    def __getitems__(self, indices: list[int]) -> SyntheticBatch:
        index = torch.as_tensor(indices, dtype=torch.int64)
        if not (self.shift or self.flip):
            return SyntheticBatch(self.images[index], self.labels[index])
        size = self.images.shape[-1]
        offsets = torch.randint(0, 2 * self.shift + 1, (len(indices), 2)).tolist() if self.shift else None
        flips = (torch.rand(len(indices)) < 0.5).tolist() if self.flip else None
        out = torch.empty((len(indices), *self.images.shape[1:]))
        for n, i in enumerate(indices):
            if offsets:
                dy, dx = offsets[n]
                out[n] = self.padded[i, :, dy : dy + size, dx : dx + size]
            else:
                out[n] = self.images[i]
            if flips and flips[n]:
                out[n] = out[n].flip(-1)
        return SyntheticBatch(out, self.labels[index])


def grey_splits(
    train: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    size: int,
    channels: int,
    sizes: tuple[int | None, int | None] = (None, None),
    flip: bool = False,
) -> tuple[TensorImages, TensorImages]:
    """(train with augmentation, test without) from ``train`` / ``test`` = (N x 1 x H x W
    pixels in [0, 1], labels): resized to ``size``, normalised with the full training
    split's statistics, ``channels`` channels, the first ``sizes`` = (n_train, n_test)
    images (None: all). Training shifts by up to ``size // 8`` pixels and flips if ``flip``."""
    train_x, test_x = resize(train[0], size), resize(test[0], size)
    mean, std = train_x.mean().item(), train_x.std().item()
    n_train, n_test = (
        (len(train[1]) if sizes[0] is None else sizes[0]),
        (len(test[1]) if sizes[1] is None else sizes[1]),
    )
    train_x, test_x = train_x[:n_train], test_x[:n_test]
    train_set = TensorImages(train_x, train[1][:n_train], mean, std, shift=size // 8, flip=flip)
    test_set = TensorImages(test_x, test[1][:n_test], mean, std)
    for s in (train_set, test_set):  # grey repeated over the channels: views, held once
        s.images = s.images.expand(-1, channels, -1, -1)
        if s.shift:
            s.padded = s.padded.expand(-1, channels, -1, -1)
    return train_set, test_set
