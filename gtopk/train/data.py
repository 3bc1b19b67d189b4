"""Datasets and loaders: CIFAR-10 (torchvision), ImageNet (ImageFolder), the UCI digits
(scikit-learn's copy, ``gtopk.train.digits``), synthetic tensors.

Each family is a ``DataSource`` that Hydra instantiates from ``conf/data/<name>.yaml``.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.datasets import CIFAR10

from gtopk.host import die_with_parent
from gtopk.train.batch import SyntheticBatch, collate

CIFAR_MEAN, CIFAR_STD = (0.491, 0.482, 0.447), (0.247, 0.243, 0.262)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class DataError(ValueError):
    """A dataset is missing or malformed."""


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


class DataSource:
    """A dataset family; Hydra builds one from ``cfg.data`` (``_target_``).

    ``check()`` runs in the launching process before any worker starts; ``datasets()`` runs
    in each worker and returns (train, test) with the paper's augmentations.
    """

    name = "base"

    def check(self) -> int | None:
        """Raise DataError naming the path looked at and how to get the data, if the data
        is missing or cannot be read; return the number of training samples when known."""
        return None

    def datasets(self) -> tuple[Dataset, Dataset]:
        raise NotImplementedError


class Synthetic(DataSource):
    name = "synthetic"

    def __init__(self, shape: list[int], num_classes: int, train_size: int = 1024, test_size: int = 256, seed: int = 0):
        self.shape, self.num_classes = tuple(shape), num_classes
        self.train_size, self.test_size, self.seed = train_size, test_size, seed

    def check(self) -> int:
        return self.train_size

    def datasets(self) -> tuple[Dataset, Dataset]:
        return (
            SyntheticDataset(self.shape, self.num_classes, self.train_size, self.seed),
            SyntheticDataset(self.shape, self.num_classes, self.test_size, self.seed + 1),
        )


class Digits(DataSource):
    """The UCI handwritten digits shipped with scikit-learn (``gtopk.train.digits``: split,
    upscaling to ``image_size``, normalisation, augmentation); ``train_size`` /
    ``test_size``: the first images of each split only (null: all 1,437 / 360)."""

    name = "digits"

    def __init__(self, image_size: int = 32, train_size: int | None = None, test_size: int | None = None):
        self.image_size, self.train_size, self.test_size = image_size, train_size, test_size

    def check(self) -> int:
        from gtopk.train import digits

        for key, value, most in (("train_size", self.train_size, 1437), ("test_size", self.test_size, 360)):
            if value is not None and (not isinstance(value, int) or not 1 <= value <= most):
                raise DataError(f"data.{key}={value!r} must be an integer in [1, {most}], or null for all")
        if not isinstance(self.image_size, int) or self.image_size < 8:
            raise DataError(f"data.image_size={self.image_size!r} must be an integer >= 8 (pixels), e.g. 32")
        try:
            digits.load()
        except (OSError, ValueError) as e:
            raise DataError(f"the digits data could not be read ({e}). Fix: pip install scikit-learn") from None
        return 1437 if self.train_size is None else self.train_size

    def datasets(self) -> tuple[Dataset, Dataset]:
        from gtopk.train import digits

        return digits.splits(self.image_size, self.train_size, self.test_size)


class Cifar10(DataSource):
    """torchvision's CIFAR10 (python pickles) under ``root/cifar-10-batches-py``."""

    name = "cifar10"
    FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]

    def __init__(self, root: str, download: bool = False, verify: bool = True):
        self.root = Path(root).expanduser()
        self.download = download
        self.verify = verify  # false: accept files whose MD5 differs from the official release

    def check(self) -> int | None:
        """Missing files, then a full read (MD5 too unless verify=false; about a second)."""
        folder = self.root / "cifar-10-batches-py"
        missing = [n for n in self.FILES if not (folder / n).is_file()]
        if missing and not self.download:
            raise DataError(
                f"CIFAR-10 not found: looked for {', '.join(missing)} in {folder}. Fix: extract "
                f"cifar-10-python.tar.gz under data.root={self.root}, or pass data.download=true."
            )
        if missing:
            return None  # the workers download it
        return len(self.datasets()[0])

    def datasets(self) -> tuple[Dataset, Dataset]:
        from torchvision import datasets
        from torchvision import transforms as T

        norm = T.Normalize(CIFAR_MEAN, CIFAR_STD)
        train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), norm])
        test_tf = T.Compose([T.ToTensor(), norm])
        cls = datasets.CIFAR10 if self.verify else _UnverifiedCIFAR10
        try:
            return (
                cls(str(self.root), True, train_tf, download=self.download),
                cls(str(self.root), False, test_tf, download=False),
            )
        except Exception as e:  # corrupt pickles, failed integrity check
            raise DataError(
                f"CIFAR-10 under {self.root / 'cifar-10-batches-py'} could not be read ({e}). "
                "Fix: re-extract cifar-10-python.tar.gz there, or pass data.download=true."
            ) from e


class _UnverifiedCIFAR10(CIFAR10):
    """torchvision's CIFAR10 loader without the MD5 check of the official files (module
    level, so DataLoader workers started with spawn can unpickle it)."""

    def _check_integrity(self) -> bool:
        folder = Path(self.root) / self.base_folder
        return all((folder / name).is_file() for name, _ in self.train_list + self.test_list)

    def _load_meta(self) -> None:
        with open(Path(self.root) / self.base_folder / self.meta["filename"], "rb") as f:
            self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}


class ImageNet(DataSource):
    """ILSVRC-2012 as ImageFolders: ``root/train/<class>/*`` and ``root/val/<class>/*``."""

    name = "imagenet"

    def __init__(self, root: str):
        self.root = Path(root).expanduser()

    def check(self) -> int | None:
        """Both splits are folders of class folders, and the first image of each opens."""
        from PIL import Image

        for split in ("train", "val"):
            folder = self.root / split
            if not folder.is_dir() or not any(p.is_dir() for p in folder.iterdir()):
                raise DataError(
                    f"ImageNet not found: {folder} is not a folder of class sub-folders. Fix: lay "
                    "out ILSVRC-2012 as data.root/train/<class>/*.JPEG and data.root/val/<class>/"
                    f"*.JPEG (data.root={self.root})."
                )
            first = next((f for d in sorted(folder.iterdir()) if d.is_dir() for f in sorted(d.iterdir())), None)
            try:
                if first is None:
                    raise OSError("no image files")
                with Image.open(first) as im:
                    im.verify()
            except OSError as e:
                raise DataError(
                    f"ImageNet under {folder} could not be read ({first}: {e}). Fix: re-extract "
                    f"ILSVRC-2012 there (data.root={self.root})."
                ) from None
        return None  # counting 1.28 M files would take longer than it is worth

    def datasets(self) -> tuple[Dataset, Dataset]:
        from torchvision import datasets
        from torchvision import transforms as T

        norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
        train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
        test_tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
        return (
            datasets.ImageFolder(str(self.root / "train"), train_tf),
            datasets.ImageFolder(str(self.root / "val"), test_tf),
        )


def build_loader(
    dataset: Dataset, batch_size: int, rank: int, world: int, train: bool, seed: int, workers: int, pin: bool = False
) -> tuple[DataLoader, DistributedSampler]:
    """Per-rank loader over this rank's DistributedSampler partition. ``pin``: batches in
    page-locked memory, for a rank whose device is a GPU (on a CPU rank it would only
    create a CUDA context and count the pinning in t_data)."""
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=train, seed=seed, drop_last=train)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        drop_last=train,
        collate_fn=collate,
        persistent_workers=workers > 0,
        pin_memory=pin,
        worker_init_fn=die_with_parent,
    )  # no loader worker outlives its rank
    return loader, sampler
