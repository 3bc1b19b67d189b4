"""All P virtual ranks' gradients in one vectorised pass per chunk (``cluster.batched``).

``cluster=simulated`` computes the P ranks' gradients either one after another (the exact
mode: bit-identical to ``cluster=local``) or, here, in one pass per chunk of ranks, by one
of two engines:

* the one-pass engine (``gtopk.simulated.rankpass``), for models built from convolutions,
  linear layers and batch norms (``rankpass.supports``: the project's four models but
  AlexNet, which has dropout): the chunk's images interleaved into one ordinary forward
  and backward pass, each rank's batch norm statistics as channels of one batch norm
  call, each rank's weight gradients from hooks (grouped convolutions);
* otherwise ``torch.func.vmap`` over ``grad_and_value`` of ``functional_call``: the
  parameters are the model's own tensors, shared by every rank (``in_dims=None``: not
  copied); each rank's batch and BatchNorm running statistics are one slice of a
  stacked, rank-major tensor (``in_dims=0``): a vmapped batch norm normalises each rank's
  batch by its own batch statistics and updates only that rank's slice of the stacked
  buffers (``torch.func`` updates running statistics in place only where the buffer is
  batched).

Both share the stacked buffers and write one [P, m] matrix whose row i is rank i's flat
gradient (or add it into rank i's error-feedback residual: ``accumulate``). What they
compute is rank i's gradient on rank i's batch, as the exact mode does; only the
floating-point evaluation differs: float64 agrees to ~1e-15, float32 to ~1e-6 in relative
L2 (``tests/unit/test_batched.py``). A model that draws random numbers in its forward pass
(dropout) cannot be batched without changing the ranks' RNG streams (``vmap(randomness=
"error")`` refuses it); ``has_randomness`` tells. Evaluation runs through vmap.

``chunk`` ranks go through one pass (the rest in further passes), so memory grows with the
chunk, not with P: a pass holds ``chunk`` x (per-rank batch) images' activations and
``chunk`` per-rank gradients. Nothing here is collective.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from gtopk.simulated.rankpass import RankPass, supports

#: modules whose forward pass draws random numbers (the batched pass cannot keep the ranks' streams)
RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def has_randomness(model: nn.Module) -> bool:
    """Whether ``model`` holds a module that draws random numbers in training (dropout)."""
    return any(isinstance(mod, RANDOM_MODULES) for mod in model.modules())


class BatchedGradients:
    """Per-rank gradients of ``world`` ranks that share ``model``'s parameters.

    ``buffers``: every buffer of the model (BatchNorm running mean, variance and batch
    count) stacked rank-major, [world, ...], each rank's starting as the model's.
    ``grads``: [world, m], row i rank i's flat gradient after ``compute`` (the parameters
    in ``model.parameters()`` order, as ``gtopk.train.flatgrad`` lays them out).
    """

    def __init__(self, model: nn.Module, world: int, chunk: int, fast: bool = True):
        if chunk < 1:
            raise ValueError(f"chunk={chunk} must be >= 1")
        self.model, self.world, self.chunk = model, world, chunk
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = {n: p.detach() for n, p in named}  # the model's storage: SGD's updates show here
        self.m = sum(p.numel() for _, p in named)
        first = named[0][1]
        self.buffers = {n: b.detach().unsqueeze(0).repeat(world, *([1] * b.dim())) for n, b in model.named_buffers()}
        self.grads = torch.zeros(world, self.m, dtype=first.dtype, device=first.device)
        self._pass = vmap(grad_and_value(self._loss, has_aux=True), in_dims=(None, 0, 0, 0, None), randomness="error")
        self._eval = vmap(self._scores, in_dims=(None, 0, 0, 0), randomness="error")
        #: the one-pass engine (``gtopk.simulated.rankpass``) where the model allows it, else vmap
        self.fast = RankPass(model, self.buffers) if fast and supports(model) else None

    def _grads(self, a: int, e: int, x: Tensor, y: Tensor, scale: float) -> tuple[list[Tensor], Tensor]:
        """Ranks a..e-1's gradients on ``x`` [e - a, b, ...], ``y`` [e - a, b] (updating their
        BN statistics): one [e - a, numel] tensor per parameter, in ``names`` order, and
        their losses (float64, each times ``scale``)."""
        if self.fast is not None:
            grads, loss = self.fast.grads(x, y, slice(a, e), scale)
        else:
            bufs = {n: b[a:e] for n, b in self.buffers.items()}  # views: the pass updates them
            grads, (_, loss) = self._pass(self.params, bufs, x, y, scale)
        return [grads[n].reshape(e - a, -1) for n in self.names], loss.detach().to(torch.float64)

    def _loss(self, params: dict, buffers: dict, x: Tensor, y: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        """One rank's loss on its batch (with its own BN statistics), scaled; and its value."""
        loss = F.cross_entropy(functional_call(self.model, (params, buffers), (x,)), y) * scale
        return loss, loss.detach()

    def _scores(self, params: dict, buffers: dict, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """One rank's summed test loss and number of correct top-1 predictions on a batch."""
        out = functional_call(self.model, (params, buffers), (x,))
        return F.cross_entropy(out, y, reduction="sum"), (out.argmax(1) == y).sum()

    @torch.no_grad()
    def evaluate(self, batches: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """Each rank's summed loss and correct count on its batch ``batches[i]`` (all of one
        size), with its own BN statistics (the model in eval mode: nothing is updated);
        two [world] float64 tensors."""
        was_training = self.model.training
        self.model.eval()
        loss, correct = torch.zeros(self.world, dtype=torch.float64), torch.zeros(self.world, dtype=torch.float64)
        try:
            for a in range(0, self.world, self.chunk):
                e = min(self.world, a + self.chunk)
                x = torch.stack([batches[i][0] for i in range(a, e)])
                y = torch.stack([batches[i][1] for i in range(a, e)])
                got = self._eval(self.params, {n: b[a:e] for n, b in self.buffers.items()}, x, y)
                loss[a:e], correct[a:e] = got[0].to(loss), got[1].to(correct)
        finally:
            self.model.train(was_training)
        return loss, correct

    def rank_buffers(self, rank: int) -> list[Tensor]:
        """Rank ``rank``'s buffers as views into the stacked ones, in ``model.buffers()``
        order: writing them writes the rank's slice (checkpoints, evaluation)."""
        return [b[rank] for b in self.buffers.values()]

    def compute(self, batches: list[list[tuple[Tensor, Tensor]]], progress: Callable[[], None] | None = None) -> Tensor:
        """Every rank's gradient into ``grads`` (rank i: the mean loss over its micro-batches
        ``batches[i]``, each weighted 1 / their number, as the exact mode's backward passes
        sum them); updates each rank's BN statistics. Returns the ranks' losses [world]
        (the sum of the weighted micro-batch losses). ``progress`` is called after each pass."""
        if len(batches) != self.world or len({len(b) for b in batches}) != 1:
            raise ValueError(f"compute needs {self.world} ranks' lists of as many micro-batches each")
        micro = len(batches[0])
        losses = torch.zeros(self.world, dtype=torch.float64, device=self.grads.device)
        for j in range(micro):
            for a in range(0, self.world, self.chunk):
                e = min(self.world, a + self.chunk)
                x = torch.stack([batches[i][j][0] for i in range(a, e)])
                y = torch.stack([batches[i][j][1] for i in range(a, e)])
                parts, loss = self._grads(a, e, x, y, 1.0 / micro)
                if j == 0:
                    torch.cat(parts, dim=1, out=self.grads[a:e])  # straight into the ranks' rows
                else:
                    self.grads[a:e].add_(torch.cat(parts, dim=1))
                losses[a:e] += loss.to(losses)
                if progress:
                    progress()
        return losses

    def accumulate(
        self, batches: list[list[tuple[Tensor, Tensor]]], into: Tensor, progress=None
    ) -> tuple[Tensor, bool]:
        """``compute``, fused with error feedback's ``acc = residual + grad``: every rank's
        gradient added into row i of ``into`` [world, m] (the ranks' residuals) straight
        from the pass, without writing ``grads`` first (one pass over [world, m] fewer).
        Only when every gradient is finite (each rank's sum over its parameters' blocks
        is, which a NaN or an Inf anywhere prevents), and for one micro-batch in one chunk;
        otherwise ``into`` is left as it was and the gradients go to ``grads`` as
        ``compute`` writes them. Returns the ranks' losses and whether ``into`` got them."""
        if len(batches) != self.world or any(len(b) != 1 for b in batches) or self.chunk < self.world:
            return self.compute(batches, progress), False
        x = torch.stack([b[0][0] for b in batches])
        y = torch.stack([b[0][1] for b in batches])
        parts, losses = self._grads(0, self.world, x, y, 1.0)
        if progress:
            progress()
        if not bool(torch.isfinite(torch.stack([p.sum(1) for p in parts]).sum(0)).all()):
            torch.cat(parts, dim=1, out=self.grads)  # the exact test decides (a finite sum may overflow)
            return losses, False
        start = 0
        for part in parts:
            into[:, start : start + part.shape[1]].add_(part)
            start += part.shape[1]
        return losses, True


#: ``cluster.batched=auto`` batches when each rank's micro-batch holds at most this many
#: images (and P > 1, and the model has no dropout); measured on the 2-core machine with
#: the one-pass engine (docs/simulated.md): at 32 x 32 pixels the two modes tie at 16
#: images per rank and the exact one is faster at 32; at 8 x 8 the batched one is faster
#: up to 32 and ties at 64. The bound is 32 x 32's, at every image size (at 8 x 8 it leaves
#: 32 images per rank to the exact mode, bit-identical to ``cluster=local``, though slower).
#: On a GPU, where a pass costs its kernel launches, the bound does not apply: on an H200,
#: P = 4 x 32 images took 0.29 s an epoch batched against 0.68 s exact at 32 x 32 pixels, and
#: 0.39 against 0.51 s at 8 x 8 (docs/gpu.md)
BATCHED_UP_TO = 16


def use_batched(
    setting: str | bool, world: int, batch_size: int, model: nn.Module, device: torch.device | None = None
) -> bool:
    """Whether ``cluster.batched`` (``auto``, true or false) means the batched pass here:
    ``auto`` batches when P > 1 and the model has no dropout, on the CPU only up to
    ``BATCHED_UP_TO`` images per rank, on CUDA at any size."""
    if setting == "auto":
        small = batch_size <= BATCHED_UP_TO or (device is not None and device.type == "cuda")
        return world > 1 and small and not has_randomness(model)
    return bool(setting)
