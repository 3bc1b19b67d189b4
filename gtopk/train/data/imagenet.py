"""ILSVRC-2012 as ImageFolders (``data=imagenet``): ``root/train/<class>/*`` and
``root/val/<class>/*``, with the usual random-resized-crop augmentation at 224 pixels."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset

from gtopk.train.data.base import DataError, DataSource

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


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

    def sample_shape(self) -> tuple[int, int, int]:
        return (3, 224, 224)

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
