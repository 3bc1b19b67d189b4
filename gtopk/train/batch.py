"""A batch already stacked, and the collate_fn that passes it on without a copy per sample.

Below every dataset module (the package ``gtopk.train.data``): its in-memory sets return a
``SyntheticBatch`` from ``__getitems__`` and ``build_loader`` collates with ``collate``.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor
from torch.utils.data import default_collate


class SyntheticBatch(Sequence):
    """What ``SyntheticDataset.__getitems__`` returns: the samples (image, label) of one
    batch, for any collate_fn, over the batch's two stacked tensors (``images``, ``labels``)."""

    def __init__(self, images: Tensor, labels: Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, k: int):
        return self.images[k], int(self.labels[k])


def collate(batch):
    """``build_loader``'s collate_fn: a ``SyntheticBatch`` as its stacked ``[images, labels]``
    (what ``default_collate`` would build from its samples, without the copy per sample);
    anything else through ``default_collate``."""
    if isinstance(batch, SyntheticBatch):
        return [batch.images, batch.labels]
    return default_collate(batch)
