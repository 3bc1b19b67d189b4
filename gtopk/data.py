"""Datasets and loaders: CIFAR-10 (torchvision), ImageNet (ImageFolder), synthetic tensors.

Each family is a ``DataSource`` that Hydra instantiates from ``conf/data/<name>.yaml``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.datasets import CIFAR10

from gtopk.launch import die_with_parent

CIFAR_MEAN, CIFAR_STD = (0.491, 0.482, 0.447), (0.247, 0.243, 0.262)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class DataError(ValueError):
    """A dataset is missing or malformed."""


class SyntheticDataset(Dataset):
    """Random images and labels of the right shapes, fixed by seed (no disk, no download)."""

    def __init__(self, shape: tuple[int, ...], num_classes: int, size: int, seed: int = 0):
        self.shape, self.num_classes, self.size, self.seed = tuple(shape), num_classes, size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randn(self.shape, generator=g), int(torch.randint(self.num_classes, (1,), generator=g))


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

    def __init__(self, shape: list[int], num_classes: int, train_size: int = 1024,
                 test_size: int = 256, seed: int = 0):
        self.shape, self.num_classes = tuple(shape), num_classes
        self.train_size, self.test_size, self.seed = train_size, test_size, seed

    def check(self) -> int:
        return self.train_size

    def datasets(self) -> tuple[Dataset, Dataset]:
        return (SyntheticDataset(self.shape, self.num_classes, self.train_size, self.seed),
                SyntheticDataset(self.shape, self.num_classes, self.test_size, self.seed + 1))


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
        from torchvision import datasets, transforms as T

        norm = T.Normalize(CIFAR_MEAN, CIFAR_STD)
        train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), norm])
        test_tf = T.Compose([T.ToTensor(), norm])
        cls = datasets.CIFAR10 if self.verify else _UnverifiedCIFAR10
        try:
            return (cls(str(self.root), True, train_tf, download=self.download),
                    cls(str(self.root), False, test_tf, download=False))
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
                raise DataError(f"ImageNet under {folder} could not be read ({first}: {e}). Fix: re-extract "
                                f"ILSVRC-2012 there (data.root={self.root}).") from None
        return None  # counting 1.28 M files would take longer than it is worth

    def datasets(self) -> tuple[Dataset, Dataset]:
        from torchvision import datasets, transforms as T

        norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
        train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
        test_tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
        return (datasets.ImageFolder(str(self.root / "train"), train_tf),
                datasets.ImageFolder(str(self.root / "val"), test_tf))


def build_loader(dataset: Dataset, batch_size: int, rank: int, world: int, train: bool,
                 seed: int, workers: int) -> tuple[DataLoader, DistributedSampler]:
    """Per-rank loader over this rank's DistributedSampler partition."""
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=train,
                                 seed=seed, drop_last=train)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                        drop_last=train, persistent_workers=workers > 0,
                        pin_memory=torch.cuda.is_available(),
                        worker_init_fn=die_with_parent)  # no loader worker outlives its rank
    return loader, sampler
