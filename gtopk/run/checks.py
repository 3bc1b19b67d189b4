"""Bad input, caught before any worker starts: each problem is a ``ConfigError`` whose
one-line message names the setting and the fix (``run.py`` prints it as one line).

* ``validate``: the top-level settings (nodes, density, mode, batch, timeouts, a fixed
  ``master_port`` that is free, ``threads_per_worker``, fault injection, ``nonfinite``), the
  recipe's plain values (``gtopk.run.settings``), and every object built from a config node
  (``gtopk.run.nodes``: ``compute``, ``cluster``, ``data``, ``model.net``).
* ``reducer_settings``: the reducer's own checks (its constructor, which communicates nothing).
* ``data_fits``: every rank's share of the training set holds at least one step, and a
  training run times at least one step after ``benchmark.warmup``.
* ``placement``: the device and backend a job runs on, resolved from ``device``, ``backend``
  and what the job needs (``auto``: a GPU only for real forward and backward, and only where
  there is one), and the pairs NCCL or gloo cannot run refused.
* ``model_takes``: the model takes the data's inputs (channels, image size).
* ``machine_fits``: the workers this job would spawn fit this machine (below);
  ``local_gpus``: under torchrun, this machine's ranks have a GPU each.

The command line itself (malformed overrides, unknown choices, ``name``): ``gtopk.run.overrides``.

"More than this machine can serve" (spawned workers only; under torchrun each node is
its own machine): on CUDA every rank needs a GPU of its own (NCCL refuses two ranks on one),
so ``nodes`` may not exceed the GPU count; and ``nodes`` workers must fit in physical memory by a deliberately low
estimate — ``WORKER_BASE_MB`` of private memory per worker process (Python, torch, gloo:
about 370 MB measured on CPU; workers forked from the fork server, ``gtopk.run.forkserver``,
share those pages: ``WORKER_BASE_MB`` once and ``FORKED_WORKER_MB`` each) plus
``BYTES_PER_PARAM`` per model parameter when the model lives in host memory (fp32 weights, gradient, momentum, flat gradient, update, residual,
accumulator, scratch). Activations are not counted, so passing the check does not
promise that the job fits; failing it means it certainly does not. Each worker also
needs a socket per peer: ``nodes`` + 256 must stay below the open-file limit.
"""

from __future__ import annotations

import os
import resource
from typing import Any

import torch
from omegaconf import OmegaConf

from gtopk.reducers import validate_density
from gtopk.run import forkserver, settings
from gtopk.run.nodes import build, buildable, meta_net
from gtopk.run.settings import ConfigError, is_int, one_line, shown
from gtopk.run.world import listen
from gtopk.train.faults import NONFINITE, FaultSpec

MODES = ("benchmark", "train")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
WORKER_BASE_MB = 350
#: what a worker forked from the fork server holds of its own besides the model's share: a
#: ResNet-20 gTop-k rank held 39 MiB private in all, 8.6 of them BYTES_PER_PARAM x its params
FORKED_WORKER_MB = 24
BYTES_PER_PARAM = 32
FDS_PER_WORKER_SPARE = 256


def _int_at_least(cfg: Any, key: str, low: int, example: str) -> None:
    value = OmegaConf.select(cfg, key)
    if not is_int(value) or value < low:
        raise ConfigError(f"{key}={shown(value)} must be an integer >= {low}, e.g. {key}={example}")


def validate(cfg: Any) -> dict[str, Any]:
    """The top-level settings, the recipe's values (``gtopk.run.settings``) and the objects
    built from config nodes (``gtopk.run.nodes``); raises ConfigError naming the first bad
    one. Returns the built ``compute``, ``cluster`` and ``data`` (``nodes.buildable``)."""
    _int_at_least(cfg, "nodes", 1, "4")
    try:
        validate_density(cfg.density)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.mode not in MODES:
        raise ConfigError(f"mode={cfg.mode!r} is unknown; choose one of {', '.join(MODES)}")
    _int_at_least(cfg, "batch_size", 1, f"16 (by default model.batch_size.{cfg.mode})")
    _int_at_least(cfg, "grad_accum", 1, f"1 (by default model.grad_accum.{cfg.mode})")
    _int_at_least(cfg, "benchmark.iters", 1, "3")
    port = cfg.get("master_port", 0)
    if not is_int(port) or not 0 <= port <= 65535:
        raise ConfigError(f"master_port={shown(port)} must be a TCP port (1-65535), or 0 to pick a free one")
    if port:
        listen("127.0.0.1", port).close()  # PortInUse (bad input) names master_port; spawn binds it again
    problems = FaultSpec.from_cfg(cfg.get("fault")).problems()
    if problems:
        raise ConfigError(problems[0])
    if cfg.get("nonfinite", "stop") not in NONFINITE:
        raise ConfigError(
            f"nonfinite={cfg.nonfinite!r} is unknown; choose one of {', '.join(NONFINITE)} "
            "(stop: the job fails; skip: the step is skipped and recorded)"
        )
    settings.validate(cfg)
    return buildable(cfg)


def reducer_settings(cfg: Any, backend: str = "gloo") -> None:
    """Build the reducer here, in the parent: its constructor checks its settings
    (density, algorithm, put-back, bucket size) and, with no process group in this
    process, makes a one-worker reducer that communicates nothing. Then its
    ``check_job`` checks what depends on the job (mode, warm-up, ``backend``)."""
    reducer = build(cfg, "reducer")
    try:
        type(reducer).check_job(cfg, backend)
    except Exception as e:  # noqa: BLE001 - a setting the check cannot even compare is bad too
        text = one_line(e)
        raise ConfigError(text if "reducer" in text else f"reducer={cfg.reducer_name}: {text}") from None


def data_fits(cfg: Any, train_size: int | None) -> None:
    """Every rank's share of the ``train_size`` training samples (DistributedSampler,
    remainder dropped) holds at least one step of ``batch_size`` x ``grad_accum``, and
    ``mode=train`` runs more iterations than ``benchmark.warmup`` (``settings.train_iterations``)."""
    if train_size is None:
        return
    if not is_int(train_size) or train_size < 1:
        raise ConfigError(
            f"data={cfg.data_name} has {shown(train_size)} training samples; set data.train_size to an integer >= 1"
        )
    share = train_size // cfg.nodes
    step = cfg.batch_size * cfg.grad_accum
    if share < step:
        raise ConfigError(
            f"batch_size={cfg.batch_size} x grad_accum={cfg.grad_accum} = {step} samples per step, but "
            f"{cfg.data_name}'s {train_size} training samples split over nodes={cfg.nodes} leave {share} per "
            f"worker; use a smaller batch_size or grad_accum, fewer nodes, or more data"
            + (" (data.train_size)" if "train_size" in cfg.data else "")
        )
    if cfg.mode == "train":
        settings.train_iterations(cfg, train_size)


def model_takes(cfg: Any, shape: tuple[int, ...] | None) -> None:
    """The model's forward pass accepts one input of ``shape`` (the data source's
    ``sample_shape()``; None: not known, not checked), run on the meta device (no memory,
    no arithmetic): a grey source's channels against a model fixed at 3, an image size too
    small for the model's pooling."""
    if shape is None:
        return
    net = meta_net(cfg)
    try:
        with torch.device("meta"):
            net.eval()(torch.empty((1, *shape)))
    except Exception as e:  # noqa: BLE001 - any failure of the forward pass is a mismatch
        cause = str(e.__cause__ or e).splitlines()[0][:200]
        size = f"data.channels={shape[0]}, data.image_size={shape[-1]}" if len(shape) == 3 else f"shape {list(shape)}"
        raise ConfigError(
            f"model={cfg.model_name} cannot take {cfg.data_name}'s inputs of {' x '.join(map(str, shape))} "
            f"({size}): {cause}. Fix: another model (or its model.net settings), or data.channels=3 for a model "
            "fixed at 3 channels, or a larger data.image_size"
        ) from None


def count_params(cfg: Any) -> int:
    """Parameters of ``cfg.model.net``, built on the meta device (no memory, no init cost)."""
    return sum(p.numel() for p in meta_net(cfg).parameters())


def memory_total() -> int | None:
    """Physical memory of this machine in bytes (None where unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gpu_count() -> int:
    """GPUs torch can use on this machine (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def placement(device: str, backend: str, wants_gpu: bool) -> tuple[str, str]:
    """The (device, backend) a job runs on: ``cpu``/``cuda`` and ``gloo``/``nccl``.
    ``device=auto``: CUDA where there is a GPU and the job wants one (``wants_gpu``: real
    forward and backward; a replay or a network benchmark does not) or ``backend=nccl``
    asks for it, else the CPU; ``backend=auto``: NCCL on CUDA, gloo on the CPU. Refused:
    ``device=cuda`` without a GPU, NCCL on the CPU (it moves GPU tensors only) and gloo on
    CUDA (not every collective of ours runs on GPU tensors there)."""
    if device not in DEVICES:
        raise ConfigError(f"device={device!r} is unknown; choose one of {', '.join(DEVICES)}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r} is unknown; choose one of {', '.join(BACKENDS)}")
    gpus = gpu_count()
    asked = device
    if device == "auto":
        device = "cuda" if gpus and (backend == "nccl" or (backend == "auto" and wants_gpu)) else "cpu"
    if device == "cuda" and not gpus:
        raise ConfigError("device=cuda but torch finds no GPU on this machine; use device=cpu (or auto)")
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device == "cpu":
        why = "" if gpus else " and this machine has no GPU"
        raise ConfigError(
            f"backend=nccl moves GPU tensors only, but device={asked} puts them in host memory{why}; "
            "use backend=gloo (or auto) on the CPU, or device=cuda"
        )
    if backend == "gloo" and device == "cuda":
        raise ConfigError(
            "backend=gloo with device=cuda: gloo cannot run every collective on GPU tensors; "
            "use backend=nccl (or auto) with device=cuda, or device=cpu"
        )
    return device, backend


def local_gpus(device: str, local_ranks: int) -> None:
    """Under torchrun: this machine's ``local_ranks`` ranks (LOCAL_WORLD_SIZE) have a GPU
    each when the job runs on CUDA."""
    if device == "cuda" and local_ranks > gpu_count():
        raise ConfigError(
            f"torchrun started {local_ranks} ranks on this machine but it has {gpu_count()} GPU(s), one per rank "
            f"on CUDA; pass torchrun --nproc-per-node={gpu_count()} or device=cpu"
        )


def gpus_fit(device: str, nodes: int) -> None:
    """``nodes`` workers spawned on this machine have a GPU each when on CUDA."""
    if device == "cuda" and nodes > gpu_count():
        raise ConfigError(
            f"nodes={nodes} on device=cuda needs one GPU per worker, but this machine has {gpu_count()}; "
            "use fewer nodes, or torchrun to spread the workers over several machines, or device=cpu"
        )


def machine_fits(cfg: Any, device: str, processes: int | None = None) -> None:
    """The job's spawned worker processes (``processes``, default ``cfg.nodes``: one per
    worker) fit this machine, the job running on ``device`` (see the module docstring)."""
    nodes = cfg.nodes if processes is None else processes
    fix = "use fewer nodes, or torchrun to spread the workers over several machines"
    gpus_fit(device, nodes)
    model = 0 if device == "cuda" else BYTES_PER_PARAM * count_params(cfg)
    forked = forkserver.expected_method() == "forkserver"
    once = WORKER_BASE_MB * 2**20 if forked else 0
    per_worker = (FORKED_WORKER_MB if forked else WORKER_BASE_MB) * 2**20 + model
    total = memory_total()
    if total and once + nodes * per_worker > total:
        shared = f" + {WORKER_BASE_MB} MiB shared by the workers of the fork server" if forked else ""
        raise ConfigError(
            f"nodes={nodes} workers need at least {(once + nodes * per_worker) / 2**30:.1f} GiB "
            f"({per_worker / 2**20:.0f} MiB each for {cfg.model_name}{shared}), more than this machine's "
            f"{total / 2**30:.1f} GiB; {fix}"
        )
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and nodes + FDS_PER_WORKER_SPARE > soft:
        raise ConfigError(
            f"nodes={nodes} workers need about {nodes + FDS_PER_WORKER_SPARE} open files each, "
            f"above this shell's limit of {soft}; raise it (ulimit -n) or {fix}"
        )
