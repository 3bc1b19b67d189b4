"""Small datasets written in the real on-disk formats (no downloads): CIFAR-10's python
pickles and an ImageFolder of PNGs. Used by the tests and by ``analysis.reproduce``
(the CPU smoke runs of the make targets)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def _images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    """Learnable images: class c has a bright horizontal band at rows 3c..3c+2."""
    labels = rng.integers(0, 10, n)
    img = rng.integers(0, 100, (n, 3, 32, 32), dtype=np.uint8)
    for i, c in enumerate(labels):
        img[i, :, 3 * c : 3 * c + 3, :] = 255
    return img.reshape(n, 3072), [int(c) for c in labels]


def write_cifar10(root: Path, per_batch: int = 64, test: int = 64, seed: int = 0) -> Path:
    """CIFAR-10 python pickles (data_batch_1..5, test_batch, batches.meta) under root."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        data, labels = _images(test if name == "test_batch" else per_batch, rng)
        with open(folder / name, "wb") as f:
            pickle.dump(
                {
                    "batch_label": name,
                    "labels": labels,
                    "data": data,
                    "filenames": [f"{name}_{i}.png" for i in range(len(labels))],
                },
                f,
            )
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump(
            {"label_names": [f"class{i}" for i in range(10)], "num_cases_per_batch": per_batch, "num_vis": 3072}, f
        )
    return root


def write_imagefolder(root: Path, classes: int = 3, per_class: int = 4, size: int = 40) -> Path:
    """An ImageFolder of PNGs: root/{train,val}/<class>/*.png."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(classes):
            d = root / split / f"n{c:08d}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root
