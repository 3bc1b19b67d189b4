"""Datasets and loaders, one module per source; Hydra builds a source from
``conf/data/<name>.yaml`` (``_target_``).

* ``base``: ``DataSource`` (``check()`` in the launching process, ``datasets()`` in each
  worker), ``DataError``, the shared setting checks;
* ``synthetic``: random tensors of the model's input shape (no disk);
* ``digits``: the UCI digits that scikit-learn ships; ``fashion_mnist``: Fashion-MNIST's
  IDX files (Debian's ``dataset-fashion-mnist``); both held in memory (``tensors``);
* ``cifar``: CIFAR-10 (torchvision); ``imagenet``: ILSVRC-2012 image folders;
* ``loader``: ``build_loader``, each rank's loader over its partition.

Below them all: ``gtopk.train.batch`` (the stacked batch and its collate_fn).
"""

from gtopk.train.data.base import DataError, DataSource
from gtopk.train.data.cifar import Cifar10
from gtopk.train.data.digits import Digits
from gtopk.train.data.fashion_mnist import FashionMNIST
from gtopk.train.data.imagenet import ImageNet
from gtopk.train.data.loader import build_loader
from gtopk.train.data.synthetic import Synthetic, SyntheticDataset

__all__ = [
    "Cifar10",
    "DataError",
    "DataSource",
    "Digits",
    "FashionMNIST",
    "ImageNet",
    "Synthetic",
    "SyntheticDataset",
    "build_loader",
]
