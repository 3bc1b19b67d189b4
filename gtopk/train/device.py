"""This rank's device: the job's ``device`` (``cpu`` or ``cuda``, resolved before any worker
starts by ``gtopk.run.checks.placement``) bound to this process, and on CUDA in
``mode=train`` the determinism that bit-identical results (simulated against distributed
workers, a resumed run against an uninterrupted one) rest on. Nothing here is collective."""

from __future__ import annotations

import os

import torch
from omegaconf import DictConfig

from gtopk.host import local_gpu

#: cuBLAS's deterministic workspace (read at its first call, so set before any)
CUBLAS_WORKSPACE = ":4096:8"


def pick_device(cfg: DictConfig, local_rank: int) -> torch.device:
    """The device of the rank with this machine-local index: the CPU, or GPU ``local_rank``
    made current (``gtopk.host.local_gpu`` refuses more ranks than GPUs). ``auto`` (a worker
    started without the job's checks): CUDA when available."""
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    gpu = local_gpu(local_rank)
    torch.cuda.set_device(gpu)
    if cfg.mode == "train":
        deterministic_cuda()
    return torch.device("cuda", gpu)


def deterministic_cuda() -> None:
    """cuDNN and cuBLAS pick deterministic kernels (no autotuning), and torch's
    deterministic implementations replace the others; an op that has none warns (its name
    in the log), since bit-identity then no longer holds. Benchmarks keep the fast kernels."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
