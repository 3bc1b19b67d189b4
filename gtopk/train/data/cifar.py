"""CIFAR-10 (``data=cifar10``): torchvision's CIFAR10 (python pickles) under
``root/cifar-10-batches-py``, with the paper's augmentation (random crop with padding,
horizontal flip, normalisation), at ``image_size`` pixels per side. torchvision is imported
where the data is read (``datasets``, ``transforms``), not with this module: a replayed
benchmark's worker never reads data and spares its memory (docs/cluster.md, memory per rank)."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset

from gtopk.train.data.base import DataError, DataSource, check_image_size

CIFAR_MEAN, CIFAR_STD = (0.491, 0.482, 0.447), (0.247, 0.243, 0.262)
NATIVE = 32  # CIFAR-10's pixels per side


class Cifar10(DataSource):
    """torchvision's CIFAR10 under ``root/cifar-10-batches-py``.

    ``image_size`` other than 32: every image is first resized (bilinear, antialiased) to
    ``image_size``, then augmented as at 32 with the padding scaled alike (``image_size //
    8``: 4 at 32, 2 at 16, 1 at 8 or 14); the test images are resized only.
    """

    name = "cifar10"
    FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]

    def __init__(self, root: str, download: bool = False, verify: bool = True, image_size: int = NATIVE):
        self.root = Path(root).expanduser()
        self.download = download
        self.verify = verify  # false: accept files whose MD5 differs from the official release
        self.image_size = image_size

    def check(self) -> int | None:
        """The settings, missing files, then a full read (MD5 too unless verify=false; about a second)."""
        check_image_size(self.image_size)
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

    def sample_shape(self) -> tuple[int, int, int]:
        return (3, self.image_size, self.image_size)

    def transforms(self) -> tuple:
        """(training transform, test transform) at ``image_size``."""
        from torchvision import transforms as T

        size = self.image_size
        norm = T.Normalize(CIFAR_MEAN, CIFAR_STD)
        resize = [] if size == NATIVE else [T.Resize((size, size), antialias=True)]
        train = T.Compose(
            [*resize, T.RandomCrop(size, padding=size // 8), T.RandomHorizontalFlip(), T.ToTensor(), norm]
        )
        return train, T.Compose([*resize, T.ToTensor(), norm])

    def datasets(self) -> tuple[Dataset, Dataset]:
        from torchvision import datasets

        from gtopk.train.data.cifar_unverified import UnverifiedCIFAR10

        train_tf, test_tf = self.transforms()
        cls = datasets.CIFAR10 if self.verify else UnverifiedCIFAR10
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
