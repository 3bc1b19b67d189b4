"""Bad input: clear errors naming the setting, before any process is spawned where
possible, and no hang where a rank's input differs from the others'."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from pathlib import Path

import pytest

from gtopk.reducers import GTopKReducer, TopKReducer, validate_density
from gtopk.run.overrides import unknown_choice
from gtopk.run.spawn import PortInUse, WorkerError, listen, spawn
from tests.config import CONF, options
from tests.datagen import write_cifar10
from tests.procs import FAST, ROOT, one_line_error, run
from tests.workers import bad_gradient, fail_on_rank1


@pytest.mark.parametrize("density", [0, -0.1, 1.5, float("nan"), "abc", None])
@pytest.mark.parametrize("cls", [TopKReducer, GTopKReducer])
def test_density_outside_0_1_is_rejected_without_processes(cls, density):
    with pytest.raises(ValueError, match=r"density=.*\(0, 1\]"):
        cls(density=density)


def test_validate_density_accepts_the_range_as_numbers_only():
    assert validate_density(1) == 1.0 and validate_density(0.001) == 0.001
    for wrong in (True, "0.001", None):
        with pytest.raises(ValueError, match="is not a number"):
            validate_density(wrong)


@pytest.mark.parametrize("setting,value", [("algorithm", "ring"), ("putback", "none")])
def test_unknown_gtopk_setting_lists_choices(setting, value):
    with pytest.raises(ValueError, match=f"reducer.{setting}='{value}'.*choose one of"):
        GTopKReducer(density=0.01, **{setting: value})


@pytest.mark.parametrize("kind", ["dense", "topk", "gtopk"])
@pytest.mark.parametrize(
    "mode,error",
    [("size", "ValueError: gradient sizes differ"), ("dtype", "TypeError: reducer input must be one flat")],
)
def test_mismatched_gradients_fail_on_every_rank_without_hanging(kind, mode, error):
    out = spawn(bad_gradient, 2, (kind, mode), timeout=60)
    for msg in out:
        assert msg.startswith(error), msg
    if mode == "dtype":
        assert "rank 1: dtype torch.int64" in out[0] and ".float()" in out[0]
    else:
        assert "rank 0: 100, rank 1: 101" in out[0]


@pytest.mark.parametrize("how,text", [("raise", "injected failure on rank 1"), ("kill", "exited with code -9")])
def test_a_failing_rank_stops_the_group(how, text):
    """The others are blocked in a collective; spawn terminates them and reports rank 1."""
    with pytest.raises(WorkerError) as info:
        spawn(fail_on_rank1, 3, (how,), timeout=60, grace=2)
    assert text in info.value.failures[1]
    assert set(info.value.failures) == {0, 1, 2}  # the others: their own gloo error, or stopped
    assert not multiprocessing.active_children()


# -- run.py: every bad setting is one line on stderr (exit 2), before any worker starts --

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra")  # hydra/: Hydra's own groups


@pytest.mark.parametrize("group", GROUPS)
def test_unknown_group_choice_lists_the_files_of_that_group(group):
    choices = options(group)
    problem = unknown_choice([f"{group}={choices[0]},nope"], CONF)
    assert problem == f"{group}=nope is unknown; choose one of {', '.join(choices)} (the files in conf/{group}/)"
    assert unknown_choice([f"{group}={c}" for c in choices] + ["nodes=3", "hydra.run.dir=x"], CONF) is None


def _expect_one_line(tmp_path: Path, args: list[str], *fragments: str, run_dir: bool = True) -> float:
    """run.py with ``args`` (after FAST's settings, and ``hydra.run.dir`` in ``tmp_path``
    unless ``run_dir`` is false) exits 2 with one ``error:`` line holding ``fragments``,
    and no worker started; returns the seconds it took."""
    fast = FAST if not any(a.startswith("data=") for a in args) else ["logger.wandb=false"]
    where = [f"hydra.run.dir={tmp_path / 'run'}"] if run_dir else []
    start = time.monotonic()
    done = run(*fast, *args, *where)
    assert done.returncode == 2, done.stderr[-3000:]
    line = one_line_error(done.stderr)
    assert line.startswith("error: ") and "Traceback" not in done.stdout + done.stderr
    for fragment in fragments:
        assert fragment in line, line
    assert not list((tmp_path / "run").glob("iters.rank*.jsonl")) and "workers" not in done.stdout
    assert not (tmp_path / "run" / "attempts.jsonl").exists()
    assert not done.left
    return done.ended - start


#: slow in ``make test``: the same check and path as a faster case kept there (reducer=nope,
#: density=0), and test_unknown_group_choice_lists_the_files_of_that_group (every group)
SLOW_TWINS = [
    pytest.param(args, fragments, marks=pytest.mark.slow)
    for args, fragments in [
        (["model=nope"], ["model=nope is unknown", "resnet20"]),
        (["data=nope"], ["data=nope is unknown", "synthetic"]),
        (["cluster=nope"], ["cluster=nope is unknown; choose one of"]),
        (["density=1.5"], ["density=1.5 is outside (0, 1]"]),
        (["density=true"], ["density=True is not a number", "density=0.001"]),
        (["density='0.01'"], ["density='0.01' is not a number", "unquoted"]),
        (["timeout_s=0.001"], ["timeout_s=0.001 must be a number of seconds >= 1"]),
    ]
]


@pytest.mark.parametrize(
    "args,fragments",
    [
        (
            ["reducer=nope"],
            # the whole list is checked in-process (test_unknown_group_choice_lists_the_files_of_that_group)
            ["reducer=nope is unknown; choose one of ddp, ddp_fp16, dense, ", "(the files in conf/reducer/)"],
        ),
        *SLOW_TWINS,
        (["density=0"], ["density=0 is outside (0, 1]", "density=0.001"]),
        # a machine without a GPU (this one; make test hides any): no rank starts to die on it
        (["device=cuda"], ["device=cuda but torch finds no GPU on this machine; use device=cpu"]),
    ],
)
def test_bad_setting_is_one_line_before_any_worker(tmp_path, args, fragments):
    """Through run.py: one line on stderr, exit 2, no worker, no records (an unknown
    choice, found before composing, and a setting; the data: the dataset test below)."""
    _expect_one_line(tmp_path, args, *fragments)


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["nodes=0"], ["nodes=0 must be an integer >= 1"]),
        (["nodes=100000"], ["nodes=100000 workers need at least", "GiB", "use fewer nodes, or torchrun"]),
        (["nodes=2", "batch_size=64"], ["batch_size=64 x grad_accum=1", "nodes=2 leave 32 per worker"]),
        (["density=1.5"], ["density=1.5 is outside (0, 1]"]),
        (["reducer.algorithm=ring"], ["reducer.algorithm='ring' is unknown; choose one of tree, recursive_doubling"]),
        (["reducer=dense", "reducer.bucket_mb=0"], ["reducer.bucket_mb=0 must be > 0"]),
        (["nodes=2", "grad_accum=9"], ["grad_accum=9", "use a smaller batch_size or grad_accum"]),
        (["fault.kind=boom"], ["fault.kind='boom' is unknown; choose one of raise, kill, hang, nan"]),
        (["nonfinite=maybe"], ["nonfinite='maybe' is unknown; choose one of stop, skip"]),
        (["collective_timeout_s=0"], ["collective_timeout_s=0 must be a number of seconds >= 1"]),
        (["master_port=70000"], ["master_port=70000 must be a TCP port"]),
        (["threads_per_worker=0"], ["threads_per_worker=0 must be an integer >= 1", "or null"]),
        (["benchmark.budget_s=-1"], ["benchmark.budget_s=-1 must be a number of seconds > 0"]),
        (["cluster=simulated", "mode=benchmark"], ["cluster=simulated", "mode=train"]),
        (
            ["cluster=simulated", "mode=train", "reducer=ddp", "data=digits"],
            ["reducer=ddp cannot run", "cluster=local"],
        ),
        (
            ["mode=train", "data=fashion_mnist", "data.root=/nonexistent/fashion-mnist"],
            ["Fashion-MNIST not found", "dataset-fashion-mnist", "data.root="],
        ),
        (["mode=train", "data=digits", "model=alexnet"], ["model=alexnet cannot take", "data.channels=3"]),
        (["mode=train", "data=digits", "model=vgg16", "data.image_size=16"], ["model=vgg16", "data.image_size"]),
        (
            ["cluster=simulated", "mode=train", "reducer=powersgd", "data=digits", "grad_accum=2"],
            ["reducer=powersgd with grad_accum=2", "grad_accum=1", "cluster=local"],
        ),
        (["reducer=ddp_fp16", "reducer.dtype=bfloat16", "device=cpu"], ["reducer.dtype=bfloat16 needs CUDA and NCCL"]),
        (["reducer=ddp_fp16", "reducer.dtype=int8"], ["reducer.dtype='int8' is unknown; choose one of float16"]),
        (
            ["reducer=powersgd", "reducer.start_powerSGD_iter=1000", "benchmark.warmup=2"],
            ["reducer.start_powerSGD_iter=1000 is after benchmark.warmup=2", "reducer.start_powerSGD_iter<=2"],
        ),
        (["reducer=powersgd", "reducer.start_powerSGD_iter=1"], ["reducer.start_powerSGD_iter=1 must be >= 2"]),
        (["reducer=powersgd", "reducer.matrix_approximation_rank=0"], ["reducer.matrix_approximation_rank=0"]),
        (["reducer=powersgd", "reducer.warm_start=maybe"], ["reducer.warm_start='maybe' must be true or false"]),
        # the recipe's values (gtopk.run.settings): each used to start the workers, or run
        (["model.lr=nan"], ["model.lr=nan must be a finite number > 0", "model.lr=0.1"]),
        (["model.lr=inf"], ["model.lr=inf must be a finite number > 0"]),
        (["model.lr=-1"], ["model.lr=-1 must be a finite number > 0"]),
        (["model.lr=fast"], ["model.lr='fast' must be a finite number"]),
        (["model.momentum=-0.5"], ["model.momentum=-0.5 must be a finite number in [0, 1)"]),
        (["model.weight_decay=-1e-4"], ["model.weight_decay=-0.0001 must be a finite number >= 0"]),
        (["model.lr_milestones=5"], ["model.lr_milestones=5 must be a list of epochs"]),
        (["mode=train", "train.epochs=0"], ["train.epochs=0 must be an integer >= 1", "model.epochs"]),
        (
            ["mode=train", "train.epochs=1", "train.max_iters_per_epoch=1"],
            ["benchmark.warmup=1 leaves no iteration to time", "x 1 iterations per epoch = 1", "benchmark.warmup=0"],
        ),
        (
            ["mode=train", "nodes=2", "train.epochs=2", "benchmark.warmup=16"],  # 64 samples / (2 x 4) = 8 per epoch
            ["benchmark.warmup=16 leaves no iteration to time", "train.epochs=2 x 8 iterations per epoch = 16"],
        ),
        (["train.density_warmup.density=0"], ["train.density_warmup.density=0 must be a number in (0, 1]"]),
        (["train.density_warmup.density=2"], ["train.density_warmup.density=2 must be a number in (0, 1]"]),
        (["train.density_warmup.epochs=-1"], ["train.density_warmup.epochs=-1 must be an integer >= 0"]),
        (["train.density_warmup.epochs=0.5"], ["train.density_warmup.epochs=0.5 must be an integer >= 0"]),
        (["benchmark.warmup=-1"], ["benchmark.warmup=-1 must be an integer >= 0"]),
        (["train.loader_workers=-1"], ["train.loader_workers=-1 must be an integer in [0, 1024]"]),
        (["name=../../x"], ["name='../../x' holds a path separator", "plain folder name"]),
        (["name=.."], ["name='..' names no folder of its own"]),
        (["seed=-1"], ["seed=-1 must be an integer in [0, 4294967295]"]),
        (["timeout_s=nan"], ["timeout_s=nan must be a number of seconds >= 1"]),
        (["collective_timeout_s=1e300"], ["collective_timeout_s=1e+300 must be a number of seconds >= 1"]),
        (["benchmark.budget_s=inf"], ["benchmark.budget_s=inf must be a number of seconds > 0"]),
        (["threads_per_worker=100000"], ["threads_per_worker=100000 must be an integer >= 1"]),
        (["data.train_size=abc"], ["data.train_size='abc' must be an integer >= 1"]),
        (["data.train_size=2"], ["synthetic's 2 training samples", "(data.train_size)"]),
        # a config node its class rejects (hydra's InstantiationException): one line naming it
        (["cluster=emulated", "cluster.bandwidth=fast"], ["cluster.bandwidth='fast'", "1gbit"]),
        (["model.net.num_classes=-1"], ["model.net of model=resnet20 cannot be built", "negative dimension"]),
        (["compute._target_=gtopk.nope.Compute"], ["compute=measured cannot be built", "gtopk.nope"]),
    ],
)
def test_bad_setting_is_one_line_from_the_job_checks(compose, args, fragments):
    """The checks run.py runs before any process (``gtopk.run.execute.validate``), in this
    process: the same one-line message the CLI prints after ``error: ``."""
    from gtopk.run.execute import BAD_INPUT, validate

    with pytest.raises(BAD_INPUT) as info:
        validate(compose([*FAST, *args]))
    line = str(info.value)
    assert "\n" not in line, line
    for fragment in fragments:
        assert fragment in line, line
    assert not multiprocessing.active_children()


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["model.lr=nan"], ["model.lr=nan must be a finite number > 0"]),  # was: NaN weights, then every rank failed
        pytest.param(  # was: trained, then failed at the summary (and again at every re-run)
            ["mode=train", "train.epochs=1", "train.max_iters_per_epoch=1"],
            ["benchmark.warmup=1 leaves no iteration to time"],
            marks=pytest.mark.slow,  # in make test in-process (test_bad_setting_is_one_line_from_the_job_checks)
        ),
        pytest.param(  # was: Hydra's exception
            ["cluster=emulated", "cluster.bandwidth=fast"],
            ["cluster.bandwidth='fast'"],
            marks=pytest.mark.slow,  # in make test in-process, as above
        ),
        (["nodes=["], ["override 'nodes=[' cannot be parsed", "nodes="]),  # was: Hydra's report, exit 1
    ],
)
def test_recipe_node_and_parse_errors_are_one_line_before_any_worker(tmp_path, args, fragments):
    """Through run.py, one of each path: a recipe value (the job's checks), the training
    length (with the data's size), a config node its class rejects, a malformed override
    (before Hydra); the other values are checked in-process above."""
    _expect_one_line(tmp_path, args, *fragments)


def test_a_name_outside_runs_is_refused_before_hydra_makes_any_folder(tmp_path):
    """``name=../../x`` would put the run folder two levels above ``runs/``: refused before
    Hydra creates it (Hydra makes the run folder before the job starts)."""
    escape = f"gtopk-test-{uuid.uuid4().hex[:8]}"
    outside = (ROOT / "runs" / ".." / ".." / escape).resolve()
    _expect_one_line(tmp_path, [f"name=../../{escape}"], f"name='../../{escape}' holds a path separator", run_dir=False)
    assert not outside.exists() and not (ROOT / "runs" / escape).exists()


def test_missing_and_corrupt_dataset_are_one_line(tmp_path):
    _expect_one_line(
        tmp_path,
        ["data=cifar10", f"data.root={tmp_path / 'none'}"],
        "CIFAR-10 not found",
        str(tmp_path / "none" / "cifar-10-batches-py"),
        "data.download=true",
    )
    root = write_cifar10(tmp_path / "data")
    batch = root / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:100])  # truncated pickle
    _expect_one_line(
        tmp_path, ["data=cifar10", f"data.root={root}", "data.verify=false"], "could not be read", "re-extract"
    )


def test_port_in_use_is_one_line(tmp_path):
    with listen("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        _expect_one_line(
            tmp_path, ["nodes=2", f"master_port={port}"], f"master_port={port}", "is in use", "master_port=0"
        )


def test_fixed_port_in_use_stops_spawn_before_any_worker():
    with listen("127.0.0.1", 0) as sock:
        with pytest.raises(PortInUse, match=f"master_port={sock.getsockname()[1]}"):
            spawn(fail_on_rank1, 2, ("raise",), port=sock.getsockname()[1])
    assert not multiprocessing.active_children()


@pytest.mark.parametrize(
    "env,name",
    [
        ({"RANK": "abc", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "RANK"),
        ({"MASTER_PORT": "notanumber"}, "MASTER_PORT"),
    ],
)
def test_a_launcher_variable_that_is_not_a_number_is_one_line(env, name):
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "run.py", "batch_size=4"], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr[-2000:]
    line = one_line_error(done.stderr)
    assert f"environment variable {name}=" in line and "torchrun" in line
