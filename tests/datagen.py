"""Small datasets written in the real on-disk formats (no downloads): CIFAR-10's python
pickles, an ImageFolder of PNGs, Fashion-MNIST's IDX files. Used by the tests and by ``analysis.reproduce``
(the CPU smoke runs of the make targets)."""

from __future__ import annotations

import gzip
import pickle
import struct
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


def write_idx(path: Path, array: np.ndarray) -> Path:
    """A uint8 array as an IDX file (big-endian header: two zero bytes, type 0x08 =
    unsigned byte, the number of dimensions, then each dimension as 4 bytes), gzipped when
    ``path`` ends in ``.gz``."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    data = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data += array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") if path.suffix == ".gz" else open(path, "wb") as f:
        f.write(data)
    return path


def write_fashion_mnist(root: Path, train: int = 64, test: int = 32, size: int = 28, gz: bool = True, seed: int = 0):
    """Fashion-MNIST's four IDX files under ``root`` (Debian's names, gzipped unless
    ``gz=False``): grey images where class c has a bright band at rows 2c..2c+1 (learnable),
    labels 0..9. Returns {(split, kind): the array written}."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, prefix, n in (("train", "train", train), ("test", "t10k", test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 100, (n, size, size)).astype(np.uint8)
        for i, c in enumerate(labels):
            images[i, 2 * c : 2 * c + 2, :] = 255
        suffix = ".gz" if gz else ""
        write_idx(root / f"{prefix}-images-idx3-ubyte{suffix}", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte{suffix}", labels)
        out[(split, "images")], out[(split, "labels")] = images, labels
    return out
