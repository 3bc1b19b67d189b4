"""A strict stand-in for NCCL: our distributed code runs on gloo (this machine has no GPU)
while everything NCCL would refuse or treat differently fails the test, and a GPU host is
faked around it.

* ``FakeGPUs(n)``: ``torch.cuda`` says ``n`` GPUs exist (``is_available``, ``device_count``);
  ``set_device``, ``current_device`` and ``synchronize`` are recorded instead of run, and
  anything that would really start CUDA (a tensor on ``cuda``, pinned memory) raises
  ``Violation``: a CPU job on a GPU host must never touch the GPU.
* ``NcclRules(device)``: every ``torch.distributed`` call checked as NCCL would take it:
  each tensor on the rank's own ``device``, contiguous, of a dtype NCCL carries; a reduce
  op NCCL has; no gloo-only call (``monitored_barrier``). ``init_process_group`` must be
  asked for NCCL with ``device_id`` = the GPU ``set_device`` bound before it, then runs
  gloo. ``counts`` says which calls went through.
* ``ExplicitDevice()``: a tensor made by one of torch's factory functions (``zeros``,
  ``tensor``, ``arange``, ...) without ``device=`` in this project's code raises
  ``Violation`` with the file and line (on a GPU it would land in host memory). Stricter
  than ``torch.set_default_device("meta")``, whose meta tensors can pass silently where a
  CPU op reads them (as an index, they read garbage), and blind to torch's internals.
* ``strict(rank, world, device)``: all three, for one rank of a group.

torch does the same kind of thing in ``torch.utils._device.DeviceContext`` (the mode behind
``set_default_device``, whose list of factory functions ``ExplicitDevice`` uses) and in its
own tests with ``torch.testing._internal.distributed.fake_pg``; the rules come from
``ProcessGroupNCCL.cpp`` (``check_gpu_single_tensor``: CUDA and dense, contiguous in the
tensor's suggested memory format, channels-last included, where a non-contiguous tensor in a
send or receive only warns, which we refuse too; the dtypes and reduce ops it maps to NCCL's).
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from gtopk.reducers import transport

ROOT = Path(__file__).resolve().parent.parent
#: this project's code: the frames whose factory calls must say where their tensor lives
OURS = tuple(str(ROOT / d) + "/" for d in ("gtopk", "baselines"))
#: ours, but host memory by design: the datasets a DataLoader reads (in its worker
#: processes when ``train.loader_workers`` > 0), whose batches the step moves to its device
HOST_SIDE = tuple(str(ROOT / "gtopk" / "train" / f) for f in ("data/", "datagen.py", "batch.py"))  # data/: every source

#: what ProcessGroupNCCL carries (getNcclDataType; bool travels as uint8)
NCCL_DTYPES = {
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
}
#: reduce ops NCCL has no kernel for (getNcclReduceOp refuses them)
NCCL_NO_OPS = {dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR}
#: calls that exist for gloo only
GLOO_ONLY = ("monitored_barrier",)
#: the calls that move tensors, checked
TENSOR_CALLS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "gather",
    "scatter",
)
#: calls that move no tensor of ours (objects go through the current device under NCCL)
PLAIN_CALLS = ("barrier", "all_gather_object", "broadcast_object_list", "gather_object", "batch_isend_irecv")


class Violation(AssertionError):
    """Something NCCL (or a GPU host) would refuse or treat differently."""


class _Patches:
    """Attributes replaced until ``undo`` (works in any process, no pytest needed)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def undo(self) -> None:
        while self._saved:
            owner, name, value = self._saved.pop()
            setattr(owner, name, value)


class FakeGPUs:
    """``torch.cuda`` of a host with ``count`` GPUs (see the module docstring)."""

    def __init__(self, count: int):
        self.count = count
        self.current = 0
        self.set_calls: list[int] = []
        self.synced: list[Any] = []
        self._patches = _Patches()

    def _set_device(self, device: Any) -> None:
        index = torch.device(device).index if not isinstance(device, int) else device
        if index is None or not 0 <= index < self.count:
            raise Violation(f"set_device({device!r}) on a host with {self.count} GPU(s)")
        self.set_calls.append(index)
        self.current = index

    def _lazy_init(self, *_: Any, **__: Any) -> None:
        raise Violation("CUDA was started (a tensor on cuda, pinned memory, a CUDA context) by a job on the CPU")

    def __enter__(self) -> FakeGPUs:
        cuda, p = torch.cuda, self._patches
        p.set(cuda, "is_available", lambda: True)
        p.set(cuda, "device_count", lambda: self.count)
        p.set(cuda, "set_device", self._set_device)
        p.set(cuda, "current_device", lambda: self.current)
        p.set(cuda, "synchronize", lambda device=None: self.synced.append(device))
        p.set(cuda, "_lazy_init", self._lazy_init)
        p.set(torch.Tensor, "pin_memory", self._lazy_init)  # pinning starts CUDA without _lazy_init
        return self

    def __exit__(self, *_: Any) -> None:
        self._patches.undo()


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _contiguous(t: torch.Tensor) -> bool:
    """Contiguous in some memory format torch would suggest for it (NCCL's test)."""
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    return t.is_contiguous() or (t.dim() in formats and t.is_contiguous(memory_format=formats[t.dim()]))


class NcclRules:
    """``torch.distributed`` as NCCL takes it, on gloo (see the module docstring)."""

    def __init__(self, device: torch.device | str, gpus: FakeGPUs | None = None):
        self.device = torch.device(device)
        self.gpus = gpus
        self.counts: Counter[str] = Counter()
        self._patches = _Patches()

    def _check(self, name: str, args: tuple, kwargs: dict) -> None:
        self.counts[name] += 1
        values = list(args) + list(kwargs.values())
        op = kwargs.get("op", next((a for a in args if isinstance(a, dist.ReduceOp.RedOpType)), None))
        if op in NCCL_NO_OPS:
            raise Violation(f"dist.{name}(op={op}): NCCL has no such reduction")
        for t in (t for v in values for t in _tensors(v)):
            where = f"dist.{name}: a {tuple(t.shape)} {t.dtype} tensor on {t.device}"
            if t.device != self.device:
                raise Violation(f"{where}, not on this rank's device {self.device}")
            if not _contiguous(t) or t.layout != torch.strided:
                raise Violation(f"{where} that is not dense and contiguous")
            if t.dtype not in NCCL_DTYPES:
                raise Violation(f"{where}: NCCL carries no {t.dtype}")

    def _wrap(self, name: str, fn: Callable) -> Callable:
        def checked(*args: Any, **kwargs: Any) -> Any:
            self._check(name, args, kwargs)
            return fn(*args, **kwargs)

        checked.__name__ = name
        return checked

    def _refuse(self, name: str) -> Callable:
        def refused(*_: Any, **__: Any) -> None:
            raise Violation(f"dist.{name} exists for gloo only")

        return refused

    def _init(self, fn: Callable) -> Callable:
        def init_process_group(backend: str | None = None, **kwargs: Any) -> None:
            self.counts["init_process_group"] += 1
            if backend != "nccl":
                raise Violation(f"init_process_group(backend={backend!r}) where NCCL was meant")
            device_id = kwargs.pop("device_id", None)
            if self.gpus is None or not self.gpus.set_calls:
                raise Violation("init_process_group before torch.cuda.set_device: the rank has no GPU of its own")
            if device_id != torch.device("cuda", self.gpus.current):
                raise Violation(f"init_process_group(device_id={device_id!r}), the bound GPU is {self.gpus.current}")
            return fn(backend="gloo", **kwargs)

        return init_process_group

    def __enter__(self) -> NcclRules:
        # one stand-in per call, in both namespaces (P2POp checks its op by identity)
        stand_ins = {name: self._wrap(name, getattr(c10d, name)) for name in TENSOR_CALLS + PLAIN_CALLS}
        stand_ins.update({name: self._refuse(name) for name in GLOO_ONLY})
        stand_ins["init_process_group"] = self._init(c10d.init_process_group)
        for module in (dist, c10d):
            for name, fn in stand_ins.items():
                self._patches.set(module, name, fn)
        # the group is NCCL's to our code: the sparse rounds take torch.distributed's calls, as on a GPU
        self._patches.set(transport, "backend_of", lambda group=None: "nccl")
        return self

    def __exit__(self, *_: Any) -> None:
        self._patches.undo()


class ExplicitDevice(TorchFunctionMode):
    """A factory call without ``device=`` in this project's code raises ``Violation``."""

    factories = _device_constructors()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.factories and kwargs.get("device") is None:
            where = _our_caller()
            if where:
                raise Violation(f"torch.{func.__name__} without device= at {where}: on a GPU it lands in host memory")
        return func(*args, **kwargs)


def _our_caller() -> str | None:
    """'file:line' of the factory call's caller when it is this project's code."""
    frame = sys._getframe(2)  # past this function and __torch_function__
    while frame is not None and frame.f_code.co_filename.endswith(("torch/overrides.py", "torch/utils/_device.py")):
        frame = frame.f_back
    name = frame.f_code.co_filename if frame is not None else ""
    if not name.startswith(OURS) or name.startswith(HOST_SIDE):
        return None
    return f"{Path(frame.f_code.co_filename).relative_to(ROOT)}:{frame.f_lineno}"


@contextlib.contextmanager
def strict(device: str = "cpu", gpus: int = 8, explicit: bool = False) -> Iterator[NcclRules]:
    """A GPU host of ``gpus`` GPUs, NCCL's rules on ``device``, and (``explicit``) every
    tensor our code makes saying where it lives. Inside a worker of a gloo group."""
    with FakeGPUs(gpus) as fake, NcclRules(device, fake) as rules:
        with ExplicitDevice() if explicit else contextlib.nullcontext():
            yield rules
