"""A plain SGD loop for the data tests: does a model learn from a data source's loader."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def train_losses(model: torch.nn.Module, opt: torch.optim.Optimizer, loader, sampler, epochs: int) -> list[float]:
    """``epochs`` passes over ``loader`` (its sampler's epoch set first); every step's loss."""
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses
