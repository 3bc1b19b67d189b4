"""Each rank's loader over its ``DistributedSampler`` partition of a dataset."""

from __future__ import annotations

from torch.utils.data import DataLoader, Dataset, DistributedSampler

from gtopk.host import die_with_parent
from gtopk.train.batch import collate


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
