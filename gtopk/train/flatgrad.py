"""One flat fp32 buffer that holds every parameter's gradient (local, not collective).

The training loop hands the reducers one flat gradient and applies one flat update. With
each ``p.grad`` a view of that buffer (``flat_grads``), flattening the gradients is free
and the update can be written straight into them (``reduce(flat, out=flat)``): no second
model-sized gradient copy per worker. Backward accumulates into an existing ``.grad`` in
place, ``zero_grad(set_to_none=False)`` zeroes it in place, and DDP (without
``gradient_as_bucket_view``) copies its averaged buckets into it in place, so the views
survive; ``views_intact`` tells whether something replaced them (then the loop copies).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def flat_grads(params: list[nn.Parameter], device: torch.device) -> Tensor:
    """A zeroed fp32 vector of the parameters' total size on ``device``; every ``p.grad``
    becomes a view of it when all parameters are dense fp32 tensors on ``device``
    (otherwise their gradients are left as they were, and ``views_intact`` is False)."""
    m = sum(p.numel() for p in params)
    flat = torch.zeros(m, device=device)
    if not all(p.dtype == torch.float32 and p.device == flat.device and p.layout == torch.strided for p in params):
        return flat
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p)
        offset += n
    return flat


def views_intact(params: list[nn.Parameter], flat: Tensor) -> bool:
    """Every ``p.grad`` is still the view of ``flat`` that ``flat_grads`` made (same
    storage, offset and shape)."""
    base, size, offset = flat.data_ptr(), flat.element_size(), 0
    for p in params:
        g = p.grad
        if g is None or g.data_ptr() != base + offset * size or not g.is_contiguous() or g.shape != p.shape:
            return False
        offset += p.numel()
    return True
