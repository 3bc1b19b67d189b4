"""DDP with torch's fp16 compression hook: the 16-bit all-reduce baseline (``reducer=ddp_fp16``).

Each bucket is cast to half precision, divided by P and all-reduced, then cast back
(``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook``, called
as it is inside ``baselines.ddp``'s timing hook): half DDP's bytes, the same number of
messages. ``dtype: bfloat16`` runs torch's ``bf16_compress_hook`` instead, which needs CUDA
and NCCL: it is refused before any process starts elsewhere.
"""

# no ``from __future__ import annotations``: DDP checks the hook's annotations as objects
from typing import Any

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from baselines.ddp import DDPReducer

HOOKS = {"float16": default_hooks.fp16_compress_hook, "bfloat16": default_hooks.bf16_compress_hook}


class DDPFp16Reducer(DDPReducer):
    """DDP whose buckets travel as 16-bit floats (collective: one all-reduce per bucket,
    issued by DDP from backward). Records: ``payload_bytes`` = 2 bytes per gradient entry."""

    word = 2
    #: cluster=simulated runs torch's hook on P virtual ranks (``gtopk.simulated.hooks``)
    simulatable = True
    display_name = "DDP-fp16"
    #: the sum is taken in fp16 in the backend's order (gloo's ring) on real ranks and in
    #: rank order in the simulation: the two may differ by a rounding of the largest partial
    #: sum (2^-10 of it), not of the result, which can be far smaller after cancellation; on
    #: the conformance kit's O(1) gradients that is up to 2^-9 absolute (measured: 2^-10 at
    #: a value of 1.02, and 0.11 relative at a value that cancelled)
    tolerance = (2.0**-9, 2.0**-9)
    plot_order = 30
    exact_average = False  # the buckets are rounded to 16 bits
    reference = None

    def __init__(
        self,
        dtype: str = "float16",
        bucket_mb: float = 25.0,
        group: dist.ProcessGroup | None = None,
        align_timing: bool = False,
    ):
        if dtype not in HOOKS:
            raise ValueError(f"reducer.dtype={dtype!r} is unknown; choose one of {', '.join(HOOKS)}")
        super().__init__(bucket_mb, group, align_timing)
        self.dtype = dtype

    @classmethod
    def check_job(cls, cfg: Any, backend: str) -> None:
        """bf16 needs CUDA and NCCL (torch's ``bf16_compress_hook``)."""
        if cfg.reducer.get("dtype") == "bfloat16" and backend != "nccl":
            raise ValueError(
                f"reducer.dtype=bfloat16 needs CUDA and NCCL (torch's bf16_compress_hook), not {backend}; "
                "use reducer.dtype=float16, or device=cuda backend=nccl"
            )

    def communicate(self, state, bucket):
        """Collective. torch's fp16 (bf16) compression hook on one bucket."""
        return HOOKS[self.dtype](state, bucket), [bucket.buffer().numel()]
