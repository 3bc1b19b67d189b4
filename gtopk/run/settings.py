"""Bad input in the recipe's plain values, caught before any worker starts (part of
``gtopk.run.checks.validate``; each problem a one-line ``ConfigError`` naming the setting
and the fix):

* ``model.lr`` (finite, > 0), ``model.momentum`` (finite, in [0, 1)), ``model.weight_decay``
  (finite, >= 0), ``model.lr_warmup_epochs`` (finite, >= 0), ``model.lr_milestones`` (a list
  of epochs >= 0), ``model.input_shape`` and ``model.num_classes`` (positive integers);
* ``train.epochs`` (an integer >= 1), ``train.max_iters_per_epoch`` (null or >= 1),
  ``train.loader_workers`` (0 to ``MAX_WORKERS``), ``train.density_warmup.epochs`` (>= 0) and,
  while that is above 0, ``train.density_warmup.density`` (in (0, 1]);
* ``benchmark.warmup`` (an integer >= 0), ``seed`` (0 to 2^32 - 1);
* ``benchmark.budget_s`` and the timeouts (seconds, finite, > 0, at most ``MAX_SECONDS``),
  ``threads_per_worker`` (null, or 1 to ``MAX_WORKERS``);
* ``data.*`` values a data source takes as they are: ``train_size`` / ``test_size`` (null or
  >= 1), ``num_classes``, ``shape``, ``seed``;
* ``name``: a plain folder name (``runs/<name>/`` holds the experiment), see ``name_problem``.

A training run must also time at least one step after ``benchmark.warmup``:
``train_iterations`` (checked where the training set's size is known,
``gtopk.run.checks.data_fits``).
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

#: the most DataLoader worker processes per rank (``train.loader_workers``) and intra-op
#: threads per worker (``threads_per_worker``): far above any useful value, low enough that
#: a typo does not start a million processes
MAX_WORKERS = 1024
MIN_TIMEOUT_S = 1  # no worker starts, or steps, faster: a shorter watchdog fails every job
MAX_SECONDS = 10**9  # about 31 years: a longer timeout overflows the waits and torch's timeouts
SEED_LIMIT = 2**32  # torch's and NumPy's generators take any seed below it


class ConfigError(ValueError):
    """A setting is invalid; the message names it and the fix (``gtopk.run.checks.ConfigError``)."""


def is_int(value: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float, not a bool (NaN and Inf are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)  # an int of any size is finite


def shown(value: Any) -> str:
    """``value`` as the command line would write it, on one line (a string quoted)."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    return repr(value)


def one_line(error: BaseException) -> str:
    """An exception's message as one line: its lines joined, Hydra's ``full_key`` /
    ``object_type`` notes and links left out, at most 300 characters."""
    skip = ("full_key:", "object_type=", "reference_type=", "See https://", "Set the environment variable")
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip() and not ln.strip().startswith(skip)]
    text = " ".join(lines) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _get(cfg: Any, key: str) -> Any:
    return OmegaConf.select(cfg, key)


def integer(cfg: Any, key: str, low: int, high: int | None = None, example: str = "1", null: str = "") -> None:
    """``key`` is an integer in [low, high] (``null``: also null, meaning that)."""
    value = _get(cfg, key)
    if null and value is None:
        return
    if not is_int(value) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        orelse = f", or null {null}" if null else ""
        raise ConfigError(f"{key}={shown(value)} must be an integer {span}{orelse}, e.g. {key}={example}")


def number(cfg: Any, key: str, low: float, high: float | None = None, *, above: bool, example: str, what: str) -> None:
    """``key`` is a finite number above ``low`` (``above``; else at least ``low``), below ``high``."""
    value = _get(cfg, key)
    ok = is_number(value) and (value > low if above else value >= low) and (high is None or value < high)
    if not ok:
        span = f"{'>' if above else '>='} {low:g}" if high is None else f"in {'(' if above else '['}{low:g}, {high:g})"
        raise ConfigError(f"{key}={shown(value)} must be a finite number {span} ({what}), e.g. {key}={example}")


def _positive_ints(cfg: Any, key: str, example: str) -> None:
    value = _get(cfg, key)
    items = list(value) if isinstance(value, ListConfig) else None
    if not items or not all(is_int(v) and v >= 1 for v in items):
        raise ConfigError(f"{key}={shown(value)} must be a list of integers >= 1, e.g. {key}={example}")


def model(cfg: Any) -> None:
    """``model.*``: the optimiser's and the schedule's numbers, the input and the classes."""
    number(cfg, "model.lr", 0, above=True, example="0.1", what="the learning rate")
    number(cfg, "model.momentum", 0, 1, above=False, example="0.9", what="SGD's momentum; 0: none")
    number(cfg, "model.weight_decay", 0, above=False, example="1e-4", what="L2 penalty; 0: none")
    number(cfg, "model.lr_warmup_epochs", 0, above=False, example="10", what="epochs of LR warm-up; 0: none")
    milestones = _get(cfg, "model.lr_milestones")
    if not isinstance(milestones, ListConfig) or not all(is_number(m) and m >= 0 for m in milestones):
        raise ConfigError(
            f"model.lr_milestones={shown(milestones)} must be a list of epochs >= 0 (the LR drops x0.1 at each), "
            "e.g. model.lr_milestones=[81,122], or [] for none"
        )
    _positive_ints(cfg, "model.input_shape", "[3,32,32]")
    integer(cfg, "model.num_classes", 1, example="10")


def train(cfg: Any) -> None:
    """``train.*`` and ``benchmark.warmup``: counts of epochs, iterations and processes."""
    value = _get(cfg, "train.epochs")
    if not is_int(value) or value < 1:
        raise ConfigError(
            f"train.epochs={shown(value)} must be an integer >= 1 (epochs to train; by default model.epochs), "
            "e.g. train.epochs=2"
        )
    integer(cfg, "train.max_iters_per_epoch", 1, example="40", null="for whole epochs")
    integer(cfg, "train.loader_workers", 0, MAX_WORKERS, example="2", null="")
    integer(cfg, "train.density_warmup.epochs", 0, example="1")
    density = _get(cfg, "train.density_warmup.density")
    if _get(cfg, "train.density_warmup.epochs") > 0 and not (is_number(density) and 0 < density <= 1):
        raise ConfigError(
            f"train.density_warmup.density={shown(density)} must be a number in (0, 1] (the density of the first "
            "train.density_warmup.epochs epochs), e.g. train.density_warmup.density=0.004, "
            "or train.density_warmup.epochs=0 for no warm-up"
        )
    integer(cfg, "benchmark.warmup", 0, example="2")


def limits(cfg: Any) -> None:
    """``benchmark.budget_s`` (with ``benchmark.min_iters``), the timeouts and ``threads_per_worker``."""
    budget = cfg.benchmark.get("budget_s")
    if budget is not None:
        if not is_number(budget) or not 0 < budget <= MAX_SECONDS:
            raise ConfigError(
                f"benchmark.budget_s={shown(budget)} must be a number of seconds > 0, "
                "or null to time benchmark.iters steps"
            )
        integer(cfg, "benchmark.min_iters", 1, example="1")
    for key in ("timeout_s", "collective_timeout_s"):
        value = cfg.get(key)
        if not is_number(value) or not MIN_TIMEOUT_S <= value <= MAX_SECONDS:
            raise ConfigError(
                f"{key}={shown(value)} must be a number of seconds >= {MIN_TIMEOUT_S} (at most 1e9): a worker takes "
                f"seconds to start and to step; e.g. {key}=120"
            )
    threads = cfg.get("threads_per_worker")
    if threads is not None and (not is_int(threads) or not 1 <= threads <= MAX_WORKERS):
        raise ConfigError(
            f"threads_per_worker={shown(threads)} must be an integer >= 1 (intra-op threads of each worker, "
            f"at most {MAX_WORKERS}), or null for this machine's cores / nodes"
        )


def seeds(cfg: Any) -> None:
    """``seed``, and the data source's ``data.seed`` where it has one."""
    integer(cfg, "seed", 0, SEED_LIMIT - 1, example="0")
    if "seed" in cfg.get("data", {}):
        integer(cfg, "data.seed", 0, SEED_LIMIT - 1, example="0")


def data(cfg: Any) -> None:
    """The ``data.*`` values the sources take unchecked (where the chosen source has them)."""
    node = cfg.get("data") or {}
    for key in ("train_size", "test_size"):
        if key in node:
            integer(cfg, f"data.{key}", 1, example="1024", null="for all")
    if "num_classes" in node:
        integer(cfg, "data.num_classes", 1, example="10")
    if "shape" in node:
        _positive_ints(cfg, "data.shape", "[3,32,32]")


def train_iterations(cfg: Any, train_size: int) -> int:
    """Iterations a ``mode=train`` job runs over ``train_size`` samples (each rank's share
    of whole steps of ``batch_size`` x ``grad_accum``, at most
    ``train.max_iters_per_epoch``, times ``train.epochs``); raises ConfigError when they
    do not exceed ``benchmark.warmup``, the iterations the summary leaves out."""
    per_epoch = train_size // (cfg.nodes * cfg.batch_size * cfg.grad_accum)
    cap = cfg.train.max_iters_per_epoch
    if cap:
        per_epoch = min(per_epoch, cap)
    total, warmup = cfg.train.epochs * per_epoch, cfg.benchmark.warmup
    if total <= warmup:
        raise ConfigError(
            f"benchmark.warmup={warmup} leaves no iteration to time: mode=train runs train.epochs={cfg.train.epochs} "
            f"x {per_epoch} iterations per epoch = {total}; use benchmark.warmup={max(total - 1, 0)} or less, "
            "or more train.epochs (or train.max_iters_per_epoch)"
        )
    return total


def name_problem(value: Any) -> str | None:
    """What is wrong with ``name`` as a folder name (None: nothing): runs go to
    ``runs/<name>/``, so it must stay one plain folder there."""
    text = value if isinstance(value, str) else None
    if is_int(value):
        text = str(value)
    if text is None:
        why = "is not a folder name"
    elif not text.strip():
        why = "is empty"
    elif text in (".", ".."):
        why = "names no folder of its own"
    elif "/" in text or "\\" in text:
        why = "holds a path separator"
    elif any(not ch.isprintable() for ch in text):
        why = "holds a control character"
    else:
        return None
    return (
        f"name={shown(value)} {why}: it must be a plain folder name (runs go to runs/<name>/): not empty, "
        "'.' or '..', without '/', '\\' or control characters, e.g. name=my_experiment"
    )


def check_name(value: Any) -> None:
    """``name_problem`` raised as a ConfigError."""
    problem = name_problem(value)
    if problem:
        raise ConfigError(problem)


def check_rerun(value: Any) -> bool:
    """``rerun`` is a boolean (``gtopk.run.execute.decide`` reads it before anything else)."""
    if not isinstance(value, bool):
        raise ConfigError(f"rerun={shown(value)} must be true or false (true: move a result of other settings aside)")
    return value


def validate(cfg: Any) -> None:
    """Every check of this module but ``train_iterations``; raises ConfigError naming the
    first bad setting."""
    limits(cfg)
    check_rerun(cfg.get("rerun", False))
    check_name(cfg.get("name"))
    seeds(cfg)
    model(cfg)
    train(cfg)
    data(cfg)
