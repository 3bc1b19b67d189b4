"""``cluster.batched``: the P virtual ranks' gradients in one vectorised pass
(``gtopk.simulated.batched``) against the exact mode (one rank after another).

Tolerances: one step's per-rank gradients agree to 1e-10 relative (L2, per rank) in
float64 and 1e-5 in float32; each rank's BatchNorm running statistics agree to the same;
each rank draws the same batches and ends with the same RNG state in both modes (the
batched pass draws nothing). Trajectories are not compared: top-k selections flip on
near-ties, so later steps drift apart by more than rounding.
"""

from __future__ import annotations

import copy
import multiprocessing

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gtopk.simulated.batched import BatchedGradients, has_randomness, use_batched
from gtopk.simulated.ranks import SimulatedRanks
from gtopk.simulated.worker import SimulatedWorker
from gtopk.train.models import ResNet20
from tests.procs import FAST


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def one_by_one(model: nn.Module, batches: list, start: list) -> tuple[list, list, list]:
    """The reference: each rank's own copy of the model (its BN statistics), autograd's
    backward over its micro-batches (loss / their number each). Returns per rank the flat
    gradient, the BN buffers after the step and the loss."""
    grads, buffers, losses = [], [], []
    for rank_batches in batches:
        net = copy.deepcopy(model)
        with torch.no_grad():
            for b, s in zip(net.buffers(), start):
                b.copy_(s)
        loss_sum = 0.0
        for x, y in rank_batches:
            loss = F.cross_entropy(net(x), y) / len(rank_batches)
            loss.backward()
            loss_sum += loss.item()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
        buffers.append([b.clone() for b in net.buffers()])
        losses.append(loss_sum)
    return grads, buffers, losses


class Mixed(nn.Module):
    """Every kind of layer the one-pass engine handles: convolutions with bias, groups,
    stride and dilation, batch norms with a momentum and with a cumulative average, an
    in-place ReLU right after a convolution, pooling, a linear layer with bias."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.bn_a = nn.BatchNorm2d(8)
        self.b = nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2, groups=2, bias=False)
        self.bn_b = nn.BatchNorm2d(8, momentum=None)
        self.c = nn.Conv2d(8, 6, 1)
        self.fc = nn.Linear(6, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn_a(self.a(x)), inplace=True), 2)
        x = F.relu(self.bn_b(self.b(x)))
        x = F.relu(self.c(x), inplace=True)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


@pytest.mark.parametrize("fast", [True, False], ids=["one-pass", "vmap"])
@pytest.mark.parametrize("net", [ResNet20, Mixed], ids=["resnet20", "mixed"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_one_pass_gives_each_rank_its_own_gradient_and_bn_statistics(dtype, tol, net, fast):
    """P = 5 ranks in chunks of 2 (passes of 2, 2, 1), 3 images per rank, 2 micro-batches,
    both engines (``gtopk.simulated.rankpass``'s one plain pass and vmap over grad)."""
    torch.manual_seed(0)
    model = (ResNet20(blocks_per_stage=1) if net is ResNet20 else net()).to(dtype).train()
    if net is Mixed and not fast:
        model.bn_b.momentum = 0.3  # vmap cannot read a cumulative average's batch count (.item())
    start = [b.detach().clone() for b in model.buffers()]
    P, micro = 5, 2
    batches = [
        [(torch.randn(3, 3, 8, 8, dtype=dtype), torch.randint(0, 10, (3,))) for _ in range(micro)] for _ in range(P)
    ]
    batched = BatchedGradients(copy.deepcopy(model), P, chunk=2, fast=fast)
    assert (batched.fast is not None) == fast
    losses = batched.compute(batches)
    want_grads, want_buffers, want_losses = one_by_one(model, batches, start)
    for i in range(P):
        assert rel(batched.grads[i], want_grads[i]) < tol, i
        assert losses[i].item() == pytest.approx(want_losses[i], rel=tol)
        for got, want in zip(batched.rank_buffers(i), want_buffers[i]):
            if want.is_floating_point():
                assert rel(got, want) < tol, i
            else:
                assert torch.equal(got, want), i  # num_batches_tracked: 2 (one per micro-batch)
    assert int(batched.rank_buffers(0)[-1]) == micro
    assert rel(batched.grads[0], batched.grads[1]) > 1e-3  # the ranks' gradients are their own


def worker(
    compose, tmp_path, batched: bool, P: int = 4, extra: tuple = (), chunk: int = 3, name: str = ""
) -> SimulatedWorker:
    cfg = compose(
        [
            "cluster=simulated",
            "mode=train",
            "data=digits",
            "data.image_size=8",
            "data.train_size=96",
            "data.test_size=16",
            "batch_size=4",
            "reducer=gtopk",
            "density=0.01",
            f"nodes={P}",
            f"cluster.batched={str(batched).lower()}",
            f"cluster.chunk={chunk}",
            *extra,
        ]
    )
    run_dir = tmp_path / (name or str(batched))
    run_dir.mkdir()
    return SimulatedWorker(P, cfg, run_dir, torch.device("cpu"))


def test_both_modes_draw_the_same_shards_and_rng_streams_and_agree_on_one_step(compose, tmp_path):
    """One step at P = 4 (chunks of 3 and 1) in each mode, from the same seed: every rank
    fetches the same images (its shard, its augmentation draws) and leaves the same RNG
    state; its gradient, loss and BN statistics agree to float32 rounding; so do the
    update (gTop-k's selection on gradients this close picks the same coordinates) and the
    evaluation after it (each rank's test shard with its own statistics)."""
    runs = {}
    for batched in (False, True):
        w = worker(compose, tmp_path, batched)
        assert (w.batched is not None) == batched
        seen: list[list] = [[] for _ in w.ranks]

        def fetcher(kept: list, stream):
            def fetch():
                got = next(stream)
                kept.append([(x.clone(), y.clone()) for x, y in got])
                return got

            return fetch

        fetches = [fetcher(seen[vr.rank], vr.groups(0)) for vr in w.ranks]
        rows = w.step(fetches, lr=0.1)
        runs[batched] = (w, seen, rows, SimulatedRanks(w).evaluate())
    (exact, seen_e, rows_e, test_e), (fast, seen_b, rows_b, test_b) = runs[False], runs[True]
    assert test_b == pytest.approx(test_e, rel=1e-5)
    for i, (a, b) in enumerate(zip(exact.ranks, fast.ranks)):
        for (xa, ya), (xb, yb) in zip(seen_e[i][0], seen_b[i][0]):
            assert torch.equal(xa, xb) and torch.equal(ya, yb), i
        assert torch.equal(a.rng["cpu"], b.rng["cpu"]), i
        assert rel(b.grad, a.grad) < 1e-5, i
        assert rows_b[i]["loss"] == pytest.approx(rows_e[i]["loss"], rel=1e-5)
        for x, y in zip(b.buffers, a.buffers):
            assert torch.equal(x, y) if not x.is_floating_point() else rel(x, y) < 1e-5, i
        assert rows_b[i]["update_nnz"] == rows_e[i]["update_nnz"]
    assert rel(fast.batched.grads[0], fast.batched.grads[1]) > 1e-3
    weights = [torch.cat([p.detach().reshape(-1) for p in w.model.parameters()]) for w in (fast, exact)]
    assert rel(*weights) < 1e-5


def test_a_non_finite_gradient_in_one_rank_row_is_found_and_nothing_is_applied(compose, tmp_path):
    w = worker(compose, tmp_path, True, extra=("fault.kind=nan", "fault.rank=2", "fault.at_iter=0"))
    before = [p.detach().clone() for p in w.model.parameters()]
    for vr in w.ranks:
        vr.faults.before_step(0)
    rows = w.step([vr.groups(0).__next__ for vr in w.ranks], lr=0.1)
    assert all(row["nonfinite_ranks"] == [2] for row in rows)
    assert all(torch.equal(p, q) for p, q in zip(w.model.parameters(), before))


def test_accumulate_adds_each_rank_gradient_into_its_row_bit_for_bit():
    """``accumulate`` (one chunk, one micro-batch) leaves ``into`` equal to ``into +
    compute's gradients`` exactly, with the same losses and BN statistics; with a NaN in
    one rank's gradient it leaves ``into`` as it was and writes ``grads`` as ``compute``."""
    torch.manual_seed(0)
    model = ResNet20(blocks_per_stage=1).train()
    P = 4
    batches = [[(torch.randn(3, 3, 8, 8), torch.randint(0, 10, (3,)))] for _ in range(P)]
    ref, fused = BatchedGradients(copy.deepcopy(model), P, chunk=P), BatchedGradients(copy.deepcopy(model), P, chunk=P)
    losses = ref.compute(batches)
    residuals = torch.randn(P, ref.m)
    into = residuals.clone()
    got, done = fused.accumulate(batches, into)
    assert done and torch.equal(got, losses)
    assert torch.equal(into, residuals + ref.grads)
    for i in range(P):
        assert all(torch.equal(a, b) for a, b in zip(fused.rank_buffers(i), ref.rank_buffers(i)))
    batches[2][0][0][0, 0, 0, 0] = float("nan")
    into = residuals.clone()
    _, done = fused.accumulate(batches, into)
    assert not done and torch.equal(into, residuals)
    assert not torch.isfinite(fused.grads[2]).all() and torch.isfinite(fused.grads[[0, 1, 3]]).all()


@pytest.mark.parametrize("chunk,micro", [(3, 1), (4, 2)])
def test_accumulate_leaves_into_alone_where_it_cannot_fuse(chunk, micro):
    """Several chunks (a later chunk's NaN would come after earlier rows were added) or
    several micro-batches: ``accumulate`` is ``compute``."""
    torch.manual_seed(0)
    model = ResNet20(blocks_per_stage=1).train()
    batches = [[(torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))) for _ in range(micro)] for _ in range(4)]
    ref, other = BatchedGradients(copy.deepcopy(model), 4, chunk), BatchedGradients(copy.deepcopy(model), 4, chunk)
    losses = ref.compute(batches)
    into = torch.zeros(4, ref.m)
    got, done = other.accumulate(batches, into)
    assert not done and torch.equal(got, losses) and torch.equal(other.grads, ref.grads)
    assert not into.any()


def test_steps_whose_gradients_go_straight_into_the_residuals_equal_the_unfused_ones(compose, tmp_path):
    """Four steps at P = 4 in one chunk, gTop-k: fused (from the second step, when the
    residuals are one matrix) and unfused give bit-identical weights, residuals, BN
    statistics and losses."""
    runs = []
    for fuse in (True, False):
        w = worker(compose, tmp_path, True, chunk=4, name=f"fuse{fuse}")
        if not fuse:
            w.fusable_residuals = lambda: None
        streams = [vr.groups(0) for vr in w.ranks]
        losses, fused = [], []
        for _ in range(4):
            rows = w.step([s.__next__ for s in streams], lr=0.1)
            losses.append([row["loss"] for row in rows])
            fused.append(w.accumulated)
        runs.append((w, losses, fused))
    (a, losses_a, fused_a), (b, losses_b, fused_b) = runs
    assert fused_a == [False, True, True, True] and not any(fused_b)
    assert losses_a == losses_b
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    for ra, rb in zip(a.ranks, b.ranks):
        assert torch.equal(ra.reducer.feedback.residual, rb.reducer.feedback.residual)
        assert all(torch.equal(x, y) for x, y in zip(ra.buffers, rb.buffers))


def test_the_one_pass_engine_takes_only_models_whose_layers_it_knows():
    """Layers that hold state it does not handle (a LayerNorm, a convolution padded 'same'
    or reflecting, a batch norm without running statistics) leave the model to vmap."""
    from torchvision.models import resnet50

    from gtopk.simulated.rankpass import supports

    assert supports(ResNet20()) and supports(Mixed()) and supports(resnet50(weights=None))
    for bad in (
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.LayerNorm([4, 6, 6])),
        nn.Conv2d(3, 4, 3, padding="same"),
        nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),
        nn.BatchNorm2d(4, track_running_stats=False),
    ):
        assert not supports(bad)
        assert BatchedGradients(bad, 2, chunk=2).fast is None


def test_the_one_pass_engine_refuses_a_layer_used_twice_and_restores_the_model():
    """A layer called twice in one forward pass would need its per-rank gradients summed
    over the uses: a one-line error naming the way out; the model's layers keep their own
    ``forward`` afterwards."""

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.fc = nn.Linear(3, 10)

        def forward(self, x):
            return self.fc(self.conv(self.conv(x)).mean((2, 3)))

    model = Twice()
    batched = BatchedGradients(model, 2, chunk=2)
    assert batched.fast is not None
    with pytest.raises(RuntimeError, match="cluster.batched=false"):
        batched.compute([[(torch.randn(2, 3, 4, 4), torch.randint(0, 10, (2,)))] for _ in range(2)])
    assert "forward" not in vars(model.conv) and "forward" not in vars(model.fc)


def test_auto_batches_small_per_rank_batches_of_models_without_dropout():
    net = ResNet20(blocks_per_stage=1)
    assert use_batched("auto", 32, 4, net) and use_batched("auto", 16, 8, net)
    assert not use_batched("auto", 4, 32, net)  # one pass per rank costs no more there
    assert not use_batched("auto", 1, 4, net)
    dropout = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    assert has_randomness(dropout) and not use_batched("auto", 32, 4, dropout)
    assert use_batched(True, 4, 32, net) and not use_batched(False, 32, 4, net)
    # on a GPU a pass costs its launches: batched at any per-rank batch, still not P = 1 or dropout
    cuda = torch.device("cuda", 0)
    assert use_batched("auto", 4, 32, net, cuda) and use_batched("auto", 4, 128, net, cuda)
    assert not use_batched("auto", 4, 32, net, torch.device("cpu"))
    assert not use_batched("auto", 1, 32, net, cuda) and not use_batched("auto", 4, 32, dropout, cuda)


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["cluster.batched=maybe"], ["cluster.batched='maybe' is unknown; choose one of auto, true, false"]),
        (["cluster.chunk=0"], ["cluster.chunk=0 must be an integer >= 1", "or null"]),
        (["cluster.batched=true", "model=alexnet"], ["cluster.batched=true with model=alexnet", "batched=false"]),
    ],
)
def test_bad_batching_settings_are_one_line_before_any_process(compose, args, fragments):
    from gtopk.run.execute import BAD_INPUT, validate

    with pytest.raises(BAD_INPUT) as info:
        validate(compose([*FAST, "cluster=simulated", "mode=train", "data=digits", "nodes=2", *args]))
    line = str(info.value)
    assert "\n" not in line, line
    for fragment in fragments:
        assert fragment in line, line
    assert not multiprocessing.active_children()
