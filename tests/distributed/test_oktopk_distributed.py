"""Ok-Topk on real worker processes (gloo, loopback) at P = 2, 3, 4, 8: every rank applies the
same update, equal to the specification's (``gtopk.reducers.oktopk.reference``) bit for bit
with the residuals, over exact steps, steps with re-used thresholds and new regions;
nothing is lost; the simulated cluster's ``reduce_group`` gives the same updates, residuals
and records; and each record's traffic is what the rank passed to the collectives (bytes
of the tensors, counted by wrapping ``torch.distributed``; padding by its sentinel)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist

from gtopk.reducers import native
from gtopk.reducers.costmodel import Traffic, dense_traffic
from gtopk.reducers.oktopk import OkTopKReducer
from gtopk.reducers.oktopk.cost import entry_bytes
from gtopk.reducers.oktopk.reference import OkTopKSpec
from gtopk.reducers.oktopk.regions import SENTINEL
from gtopk.reducers.transport import SocketTransport
from gtopk.run.spawn import spawn

RECORD = ("selected", "bytes_sent", "bytes_recv", "messages_sent", "payload_bytes")


@dataclass(frozen=True)
class Case:
    m: int
    density: float
    ties: bool = False
    options: dict = field(default_factory=dict)
    steps: int = 6
    inplace: bool = False  # reduce(grad, out=grad), as the training loop calls it

    def build(self) -> OkTopKReducer:
        return OkTopKReducer(self.density, **{"threshold_period": 3, "boundary_period": 2, **self.options})


CASES = [
    Case(1000, 0.01),
    Case(1000, 0.1, ties=True),
    Case(37, 0.2),
    Case(50, 1e-9, ties=True),  # k = 1
    Case(4000, 0.005, options={"align_timing": True}),
    Case(2000, 0.02, inplace=True),
]


def grads_for(case: Case, P: int, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * it + P)
    if case.ties:
        return [torch.randint(-3, 4, (case.m,), generator=g).float() for _ in range(P)]
    return [torch.randn(case.m, generator=g) for _ in range(P)]


class Spy:
    """Wraps the torch.distributed calls the reducer makes; counts what it passed to them."""

    def __init__(self, P: int, e: int):
        self.P, self.e = P, e
        self.traffic, self.passed, self.padding = Traffic(), 0, 0
        self.saved = {n: getattr(dist, n) for n in ("all_gather", "all_reduce", "batch_isend_irecv")}
        self.saved_sockets = {n: getattr(SocketTransport, n) for n in ("isend", "irecv")}
        self.saved_steps = native.steps

    def __enter__(self) -> Spy:
        def all_gather(out, tensor, group=None, async_op=False):
            n = tensor.numel() * tensor.element_size()
            self.traffic = self.traffic + Traffic(self.P - 1, (self.P - 1) * n, (self.P - 1) * n)
            self.passed += n
            if tensor.dtype == torch.uint8:  # an entries' block: indices first
                idx = tensor[: tensor.numel() // self.e * 4].view(torch.int32)
                self.padding += self.e * int((idx == SENTINEL).sum())
            return self.saved["all_gather"](out, tensor, group=group, async_op=async_op)

        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            self.traffic = self.traffic + dense_traffic(self.P, [tensor.numel()], tensor.element_size())
            self.passed += tensor.numel() * tensor.element_size()
            return self.saved["all_reduce"](tensor, op=op, group=group, async_op=async_op)

        def batch_isend_irecv(ops):
            for op in ops:
                n = op.tensor.numel() * op.tensor.element_size()
                send = op.op.__name__ == "isend"
                self.traffic = self.traffic + Traffic(int(send), n if send else 0, 0 if send else n)
                self.passed += n if send else 0
            return self.saved["batch_isend_irecv"](ops)

        def on_socket(name: str, send: bool):  # the rotations' own transport (the CPU's default)
            def call(transport, buf, peer):
                n = buf.numel() * buf.element_size()
                self.traffic = self.traffic + Traffic(int(send), n if send else 0, 0 if send else n)
                self.passed += n if send else 0
                return self.saved_sockets[name](transport, buf, peer)

            return call

        def steps(fds, rank, moves, **kw):  # the rotations compiled (the CPU's default where it builds)
            for _, data, _, buf in moves:
                n, r = (0 if data is None else data.size), (0 if buf is None else buf.size)
                self.traffic = self.traffic + Traffic(int(data is not None), n, r)
                self.passed += n
            return self.saved_steps(fds, rank, moves, **kw)

        dist.all_gather, dist.all_reduce, dist.batch_isend_irecv = all_gather, all_reduce, batch_isend_irecv
        SocketTransport.isend, SocketTransport.irecv = on_socket("isend", True), on_socket("irecv", False)
        native.steps = steps
        return self

    def __exit__(self, *exc) -> None:
        for n, f in self.saved.items():
            setattr(dist, n, f)
        for n, f in self.saved_sockets.items():
            setattr(SocketTransport, n, f)
        native.steps = self.saved_steps


def run_real(rank: int, P: int, cases: list[Case]) -> list[list[dict]]:
    """Worker: every case for its steps; per step the update, residual, record and counts."""
    out = []
    for case in cases:
        reducer, steps = case.build(), []
        for it in range(case.steps):
            grad = grads_for(case, P, it)[rank].clone()
            with Spy(P, entry_bytes(case.m)) as spy:
                update, rec = reducer.reduce(grad, out=grad if case.inplace else None)
            steps.append(
                {
                    "update": update.clone(),
                    "residual": reducer.feedback.residual.clone(),
                    "record": rec.as_dict(),
                    "wire": reducer.wire,
                    "did": spy.traffic,
                    "passed": spy.passed,
                    "padding": spy.padding,
                    "same_buffer": update is grad,
                }
            )
        out.append(steps)
    return out


@pytest.fixture(
    scope="module",
    params=[pytest.param(P, marks=pytest.mark.slow) for P in (2, 3, 4, 8)],  # 20-25 s a group to start here
    ids=lambda p: f"P{p}",
)
def real(request):
    P = request.param
    return P, spawn(run_real, P, (CASES,), timeout=300)


def test_every_rank_applies_the_spec_s_update_and_keeps_its_residual(real):
    P, out = real
    for c, case in enumerate(CASES):
        spec, residuals = OkTopKSpec(P, case.density, 3, 2), [torch.zeros(case.m) for _ in range(P)]
        for it in range(case.steps):
            grads = grads_for(case, P, it)
            accs = [r + g for r, g in zip(residuals, grads)]
            want, residuals = spec.step(accs)
            for rank in range(P):
                got = out[rank][c][it]
                assert torch.equal(got["update"], want), (case, it, rank)
                assert torch.equal(got["residual"], residuals[rank]), (case, it, rank)
                assert got["same_buffer"] == case.inplace
            kept = torch.stack([out[r][c][it]["residual"] for r in range(P)]).double().sum(0)
            total = torch.stack(accs).double().sum(0)
            assert torch.allclose(total, P * want.double() + kept, atol=1e-5), (case, it)  # nothing lost


def test_the_simulated_group_is_the_real_one_bit_for_bit(real):
    P, out = real
    for c, case in enumerate(CASES):
        workers = [case.build() for _ in range(P)]
        for it in range(case.steps):
            update, recs = OkTopKReducer.reduce_group(workers, grads_for(case, P, it))
            for rank in range(P):
                got = out[rank][c][it]
                assert torch.equal(update, got["update"]), (case, it)
                assert torch.equal(workers[rank].feedback.residual, got["residual"]), (case, it, rank)
                assert {n: getattr(recs[rank], n) for n in RECORD} == {n: got["record"][n] for n in RECORD}
                assert workers[rank].wire == got["wire"]


def test_records_are_what_each_rank_passed_to_the_collectives(real):
    P, out = real
    for c, case in enumerate(CASES):
        for it in range(case.steps):
            for rank in range(P):
                got = out[rank][c][it]
                rec, wire, did = got["record"], got["wire"], got["did"]
                assert (rec["messages_sent"], rec["bytes_sent"], rec["bytes_recv"]) == (
                    did.messages_sent,
                    did.bytes_sent,
                    did.bytes_recv,
                ), (case, it, rank)
                assert wire.payload + wire.padding + wire.meta == got["passed"], (case, it, rank)
                assert wire.padding == got["padding"] and rec["payload_bytes"] == wire.payload
                assert rec["t_commu"] >= 0 and rec["t_compr"] >= 0 and rec["t_merge"] >= 0
    assert any(step["padding"] for rank in out for case in rank for step in case) == (P > 1)
