"""Random tensors of the model's input shape, fixed by seed (``data=synthetic``: no disk,
no download; the throughput runs)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from gtopk.train.batch import SyntheticBatch
from gtopk.train.data.base import DataSource


class SyntheticDataset(Dataset):
    """Random images and labels of the right shapes, fixed by seed (no disk, no download).

    Item ``i`` is ``randn(shape)`` then one ``randint(num_classes)`` label, both from a
    generator seeded with ``seed * 1_000_003 + i``: the same values whatever the order of
    access, the batch size or the number of loader workers. When all items fit in
    ``cache_bytes`` (ResNet-20's 4,096 CIFAR-shaped items: 48 MiB), they are generated once
    at construction and served by indexing; otherwise (4,096 ImageNet-shaped items would take
    2.3 GiB per rank) every access generates its items again, as if there were no cache. The
    values are the same either way.

    ``__getitems__`` (called by ``DataLoader`` with automatic batching) returns a
    ``SyntheticBatch``: a sequence of (image, label) samples, so ``default_collate`` gives
    the usual ``[images, labels]``, that also holds those two tensors already stacked for
    ``collate`` (``build_loader``'s collate_fn) to return without a copy per sample.
    """

    #: the most bytes of images a dataset keeps in memory (per dataset, so per rank)
    CACHE_BYTES = 256 * 2**20

    def __init__(
        self, shape: tuple[int, ...], num_classes: int, size: int, seed: int = 0, cache_bytes: int | None = None
    ):
        self.shape, self.num_classes, self.size, self.seed = tuple(shape), num_classes, size, seed
        self.cache_bytes = self.CACHE_BYTES if cache_bytes is None else cache_bytes
        self.images = self.labels = None  # the cache, when it fits
        if size * math.prod(self.shape) * torch.get_default_dtype().itemsize <= self.cache_bytes:
            self.images, self.labels = self._generate(range(size))

    def _generate(self, indices) -> tuple[Tensor, Tensor]:
        """Items ``indices`` generated afresh: (images stacked, labels as int64)."""
        images = torch.empty((len(indices), *self.shape))
        labels = torch.empty(len(indices), dtype=torch.int64)
        g = torch.Generator()
        for k, i in enumerate(indices):
            g.manual_seed(self.seed * 1_000_003 + int(i))
            torch.randn(self.shape, generator=g, out=images[k])  # same values as a fresh randn
            labels[k] = torch.randint(self.num_classes, (1,), generator=g)[0]
        return images, labels

    def _index(self, i: int) -> int:
        if not -self.size <= i < self.size:
            raise IndexError(f"index {i} out of range for a SyntheticDataset of {self.size} items")
        return i % self.size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        i = self._index(int(i))
        if self.images is None:
            images, labels = self._generate([i])
            return images[0], int(labels[0])
        return self.images[i].clone(), int(self.labels[i])  # a copy, like a generated item

    def __getitems__(self, indices: list[int]) -> SyntheticBatch:
        indices = [self._index(int(i)) for i in indices]
        if self.images is None:
            return SyntheticBatch(*self._generate(indices))
        # NumPy's gather, on this thread only: torch's index_select splits a batch over the
        # intra-op threads and on a busy machine waits milliseconds for a descheduled one
        index = np.asarray(indices, dtype=np.int64)
        return SyntheticBatch(
            torch.from_numpy(self.images.numpy()[index]), torch.from_numpy(self.labels.numpy()[index])
        )


class Synthetic(DataSource):
    name = "synthetic"

    def __init__(self, shape: list[int], num_classes: int, train_size: int = 1024, test_size: int = 256, seed: int = 0):
        self.shape, self.num_classes = tuple(shape), num_classes
        self.train_size, self.test_size, self.seed = train_size, test_size, seed

    def check(self) -> int:
        return self.train_size

    def sample_shape(self) -> tuple[int, ...]:
        return self.shape

    def datasets(self) -> tuple[Dataset, Dataset]:
        return (
            SyntheticDataset(self.shape, self.num_classes, self.train_size, self.seed),
            SyntheticDataset(self.shape, self.num_classes, self.test_size, self.seed + 1),
        )
