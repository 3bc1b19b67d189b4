"""Per-rank gradients of R ranks from ONE ordinary forward and backward pass.

The fast engine of ``cluster.batched`` (``gtopk.simulated.batched.BatchedGradients``) for
models built from ``nn.Conv2d``, ``nn.Linear`` and ``nn.BatchNorm2d`` (``supports``):
the R ranks' batches are interleaved image by image into one batch (image j of rank r at
row ``j * R + r``), so that

* a convolution, a linear layer, an activation or a pooling layer treats every image on
  its own: one call over the whole batch, with the shared weights;
* a batch norm must normalise each rank's images by that rank's own batch statistics and
  update that rank's running statistics: the batch viewed as ``[b, R * C, H, W]`` (a view:
  rank r's channels are channels ``r * C .. r * C + C - 1``) is one ``F.batch_norm`` call
  whose running statistics are the ranks' stacked ``[R, C]`` buffers, flattened (views:
  the call updates them in place), and whose affine weight is the layer's repeated R
  times, a fresh leaf, so its gradient is each rank's;
* a convolution's or linear layer's weight gradient is each rank's sum over its own
  images: a hook on the layer's output receives the gradient there (the backward pass
  computes only input gradients through these layers) and computes all R ranks' weight
  gradients at once, a convolution's as one grouped convolution (groups = R, the batch
  viewed as ``[b, R * C, H, W]`` again), a linear layer's as one batched matrix product.

The loss is each rank's mean cross-entropy over its images, times ``scale``; the pass
draws nothing from the RNG. Compared with ``torch.func.vmap`` over ``grad`` (the general
engine), it skips the batching rules' copies of every activation around each batch norm
and the shared weights' summed gradients: 1.3-1.6x faster here (docs/simulated.md).
It computes the same per-rank gradients in another floating-point order. Local: nothing
here is collective.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def supports(model: nn.Module) -> bool:
    """Whether every module of ``model`` that holds parameters or buffers is one this
    engine handles: ``nn.Conv2d`` (numeric zero padding), ``nn.Linear`` or an affine
    ``nn.BatchNorm2d`` with running statistics (other layers must treat images apart)."""
    for mod in model.modules():
        if not (list(mod.parameters(recurse=False)) or list(mod.buffers(recurse=False))):
            continue
        if type(mod) is nn.Conv2d:
            if mod.padding_mode != "zeros" or isinstance(mod.padding, str):
                return False
        elif type(mod) is nn.BatchNorm2d:
            if not (mod.affine and mod.track_running_stats):
                return False
        elif type(mod) is not nn.Linear:
            return False
    return True


def _once(forward, name: str, called: set):
    """``forward``, refusing a second call in the same pass (a layer used twice would need
    its per-rank gradients summed over the uses; this engine assumes one)."""

    def once(x: Tensor) -> Tensor:
        if name in called:
            raise RuntimeError(
                f"layer {name!r} ran twice in one forward pass, which cluster.batched's one-pass "
                "engine does not handle; set cluster.batched=false"
            )
        called.add(name)
        return forward(x)

    return once


class RankPass:
    """One pass of R ranks (``grads``): ``model``'s parameters shared, ``buffers`` the
    model's buffers stacked rank-major ([P, ...], P >= R: a pass takes rows a..a+R-1)."""

    def __init__(self, model: nn.Module, buffers: dict[str, Tensor]):
        self.model, self.buffers = model, buffers
        self._dummy: dict[tuple, Tensor] = {}  # the grouped weight-gradient call's weight (its shape is what counts)

    def grads(self, x: Tensor, y: Tensor, rows: slice, scale: float) -> tuple[dict[str, Tensor], Tensor]:
        """Ranks ``rows``' gradients on their batches ``x`` [R, b, ...], ``y`` [R, b]: a dict
        parameter name -> [R, numel] and the ranks' losses [R] (each times ``scale``).
        Updates those ranks' BatchNorm statistics."""
        R, b = x.shape[:2]
        inputs = x.transpose(0, 1).reshape(R * b, *x.shape[2:]).requires_grad_()  # image j of rank r: row j R + r
        targets = y.transpose(0, 1).reshape(-1)
        parts: dict[str, Tensor] = {}
        leaves: dict[str, Tensor] = {}
        with self._patched(R, rows, parts, leaves):
            logits = self.model(inputs)
        losses = F.cross_entropy(logits, targets, reduction="none").view(b, R).mean(0) * scale
        losses.sum().backward()
        for name, leaf in leaves.items():
            parts[name] = leaf.grad.view(R, -1)
        return parts, losses.detach()

    @contextlib.contextmanager
    def _patched(self, R: int, rows: slice, parts: dict, leaves: dict) -> Iterator[None]:
        """The model's layers' ``forward`` replaced by their per-rank versions (instance
        attributes over the class's method), restored on the way out."""
        patched, called = [], set()
        try:
            for name, mod in self.model.named_modules():
                prefix = f"{name}." if name else ""
                if type(mod) is nn.Conv2d:
                    forward = self._conv(mod, prefix, R, parts)
                elif type(mod) is nn.Linear:
                    forward = self._linear(mod, prefix, R, parts)
                elif type(mod) is nn.BatchNorm2d:
                    forward = self._batch_norm(mod, prefix, R, rows, leaves)
                else:
                    continue
                mod.forward = _once(forward, name, called)
                patched.append(mod)
            yield
        finally:
            for mod in patched:
                del mod.forward

    def _conv(self, mod: nn.Conv2d, prefix: str, R: int, parts: dict):
        def forward(x: Tensor) -> Tensor:
            bias = None if mod.bias is None else mod.bias.detach()
            out = F.conv2d(x, mod.weight.detach(), bias, mod.stride, mod.padding, mod.dilation, mod.groups)
            seen = x.detach()

            def weight_grads(gy: Tensor) -> None:
                b, out_ch = seen.shape[0] // R, mod.out_channels
                key = (prefix, R, mod.weight.dtype)
                if key not in self._dummy:
                    self._dummy[key] = mod.weight.new_empty(R * out_ch, *mod.weight.shape[1:])
                gw = torch.ops.aten.convolution_backward(
                    gy.reshape(b, R * out_ch, *gy.shape[2:]),
                    seen.reshape(b, R * seen.shape[1], *seen.shape[2:]),
                    self._dummy[key],
                    None,
                    mod.stride,
                    mod.padding,
                    mod.dilation,
                    False,
                    [0] * len(mod.stride),
                    R * mod.groups,
                    [False, True, False],
                )[1]
                parts[prefix + "weight"] = gw.view(R, -1)
                if mod.bias is not None:
                    parts[prefix + "bias"] = gy.reshape(b, R, out_ch, -1).sum((0, 3))

            out.register_hook(weight_grads)
            return out

        return forward

    def _linear(self, mod: nn.Linear, prefix: str, R: int, parts: dict):
        def forward(x: Tensor) -> Tensor:
            bias = None if mod.bias is None else mod.bias.detach()
            out = F.linear(x, mod.weight.detach(), bias)
            seen = x.detach()

            def weight_grads(gy: Tensor) -> None:
                b = seen.shape[0] // R
                g = gy.reshape(b, R, -1)
                parts[prefix + "weight"] = torch.einsum("jro,jri->roi", g, seen.reshape(b, R, -1)).reshape(R, -1)
                if mod.bias is not None:
                    parts[prefix + "bias"] = g.sum(0)

            out.register_hook(weight_grads)
            return out

        return forward

    def _batch_norm(self, mod: nn.BatchNorm2d, prefix: str, R: int, rows: slice, leaves: dict):
        def forward(x: Tensor) -> Tensor:
            b, C = x.shape[0] // R, mod.num_features
            weight = mod.weight.detach().repeat(R).requires_grad_()
            bias = mod.bias.detach().repeat(R).requires_grad_()
            leaves[prefix + "weight"], leaves[prefix + "bias"] = weight, bias
            mean, var = self.buffers[prefix + "running_mean"][rows], self.buffers[prefix + "running_var"][rows]
            momentum = mod.momentum
            if mod.training:
                count = self.buffers[prefix + "num_batches_tracked"][rows]
                count.add_(1)
                if momentum is None:  # a cumulative average, as nn.BatchNorm2d's
                    momentum = 1.0 / float(count[0])
            out = F.batch_norm(
                x.reshape(b, R * C, *x.shape[2:]),
                mean.view(-1),
                var.view(-1),
                weight,
                bias,
                mod.training,
                momentum or 0.0,
                mod.eps,
            )
            return out.view(x.shape)

        return forward
