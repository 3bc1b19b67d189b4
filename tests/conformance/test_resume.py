"""Every ``conf/reducer`` config resumes after a kill: a real training job (``run.py
mode=train``, the offline digits, P = 2, three epochs of two steps, a checkpoint per epoch)
is SIGKILLed, its whole session, once the checkpoint of epoch 1 is complete and a step of
epoch 2 is recorded, and the same job run again resumes from that checkpoint and ends with
the weights (``weights_sha256``), every rank's per-iteration values (loss, learning rate,
density, what the reducer selected, applied and kept) and the epoch records of the same job
never killed. Once on real worker processes (``cluster=local``, gloo on
loopback) and, for a class that declares itself ``simulatable``, on the simulated cluster
(``cluster=simulated``); a way a class declares it cannot run is skipped with that reason.

The job is sure to be running when it is killed: rank 1 hangs before the last step
(``fault.kind=hang``; ``fault.*`` is not part of the job's identity nor of its run folder,
so the re-run without it is the same job, as in ``tests/e2e/test_harness.py``). The test
waits for states of the run folder (the manifest of epoch 1, rank 0's row of the step
before the hang), never for a fixed time. Each case starts ``run.py`` three times (the
uninterrupted job runs beside the one to be killed): slow (``make test-slow``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gtopk.records.rundir import RunDir, read_jsonl
from tests.config import compose_config
from tests.conformance import kit
from tests.procs import Done, finish, start

pytestmark = [pytest.mark.conformance, pytest.mark.slow]

P, EPOCHS, PER_EPOCH = 2, 3, 2  # ranks, epochs, steps per epoch
KILL_AFTER = 1  # the epoch whose checkpoint must exist when the job is killed (> 0)
HANG_AT = (KILL_AFTER + 1) * PER_EPOCH + 1  # the second step of the epoch after it: one step of it recorded
#: what a row holds that the step computed: the loss, the schedules, and what the reducer
#: selected, applied and kept (null where a reducer records none)
VALUES = ("loss", "lr", "density", "selected", "update_nnz", "residual_norm", "lost_l1")
DEADLINE_S = 300  # per wait: a failure bound for a loaded 2-core machine, not a timing


def job(name: str, cluster: str, run_dir: Path) -> list[str]:
    """``run.py`` overrides of the kit's training job for reducer ``name`` on ``cluster``."""
    return [
        f"cluster={cluster}",
        "mode=train",
        f"nodes={P}",
        f"reducer={name}",
        f"density={kit.DENSITY}",
        "data=digits",
        "data.image_size=16",
        "data.train_size=144",
        "data.test_size=24",
        "batch_size=8",
        f"train.epochs={EPOCHS}",
        f"train.max_iters_per_epoch={PER_EPOCH}",
        "train.loader_workers=0",
        "logger.wandb=false",
        f"hydra.run.dir={run_dir}",
    ]


def declared_skip(name: str, cluster: str) -> str | None:
    """Why the class says this job cannot run (None: it can): not ``simulatable`` for the
    simulated cluster, or its ``check_job`` refusing the job's settings."""
    n = kit.node(name)
    if cluster == "simulated" and (why := kit.simulated_skip(n)):
        return why
    cfg = compose_config([a for a in job(name, cluster, Path("unused")) if not a.startswith("hydra.")])
    try:
        kit.cls_of(n).check_job(cfg, "gloo")
    except ValueError as e:
        return f"{n['_target_']}.check_job: {e}"
    return None


def wait_for(proc, what: str, ready) -> None:
    """Poll the run folder until ``ready()``; fail if the job ends first or the deadline passes."""
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert proc.poll() is None, f"the job ended before {what}: {finish(proc).stderr[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S}s"
        time.sleep(0.02)


def rows(run: RunDir) -> dict[int, list[dict]]:
    """Every rank's iteration rows, in the order written (all attempts)."""
    return {r: read_jsonl(run.iters(r)) for r in range(P) if run.iters(r).exists()}


def values(rank_rows: list[dict]) -> dict[int, dict]:
    """Iteration -> what the step computed (``VALUES``, no timings), the latest attempt's
    where a step ran twice."""
    return {r["iter"]: {k: r.get(k) for k in VALUES} for r in rank_rows}


def differ(got: dict[int, dict], want: dict[int, dict]) -> str:
    """The first iteration whose values differ, for the failure message."""
    it = next((i for i in sorted(got) if got[i] != want.get(i)), None)
    return f"iteration {it}: {got.get(it)} != {want.get(it)}" if it is not None else "iterations differ"


def resumed_from(done: Done) -> int:
    """The epoch whose checkpoint the run says it resumed from (-1: it started afresh)."""
    found = re.findall(r"resuming from the checkpoint of epoch (\d+)", done.stderr)
    return int(found[-1]) if found else -1


def check_done(done: Done, run: RunDir) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    assert not done.left, done.left
    return json.loads(run.summary.read_text())


@pytest.fixture
def started() -> Iterator[Callable[..., subprocess.Popen]]:
    """``started(*args)``: ``tests.procs.start``; whatever is still running at teardown (a
    failed wait) is SIGKILLed, its whole session."""
    procs = []
    yield lambda *args: procs.append(start(*args)) or procs[-1]
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.parametrize("cluster", ["local", "simulated"])
def test_a_killed_job_resumes_to_the_weights_and_rows_of_one_never_killed(name, cluster, tmp_path, started):
    if why := declared_skip(name, cluster):
        pytest.skip(why)
    run, whole = RunDir(tmp_path / "run"), RunDir(tmp_path / "whole")
    args = job(name, cluster, run.path)
    uninterrupted = started(*job(name, cluster, whole.path))  # beside the one to kill: its own folder
    proc = started(*args, "fault.kind=hang", "fault.rank=1", f"fault.at_iter={HANG_AT}")
    wait_for(proc, f"the manifest of epoch {KILL_AFTER}", run.checkpoint_manifest(KILL_AFTER).exists)
    wait_for(proc, f"rank 0's row of iteration {HANG_AT - 1}", lambda: HANG_AT - 1 in values(rows(run).get(0, [])))
    os.killpg(proc.pid, signal.SIGKILL)
    killed = finish(proc)
    assert killed.returncode == -signal.SIGKILL and not killed.left, killed.stderr[-3000:]
    before = rows(run)
    assert not run.summary.exists() and sorted(values(before[0])) == list(range(HANG_AT))

    again = finish(started(*args))  # the same job, no fault
    summary = check_done(again, run)
    reference = check_done(finish(uninterrupted), whole)

    # the records say it resumed from epoch KILL_AFTER's checkpoint: a second attempt that
    # ran only the epochs after it
    assert [a["attempt"] for a in read_jsonl(run.attempts)] == [1, 2]
    assert resumed_from(again) == KILL_AFTER, again.stderr[-3000:]
    after = rows(run)
    first = (KILL_AFTER + 1) * PER_EPOCH
    for r in after:
        second = [row["iter"] for row in after[r] if row["attempt"] == 2]
        assert second == list(range(first, EPOCHS * PER_EPOCH)), f"rank {r}: attempt 2 ran iterations {second}"
    assert [e["epoch"] for e in read_jsonl(run.epochs)] == list(range(EPOCHS))  # each once

    # ... and ran the steps and ended where the job never killed did
    ref = rows(whole)
    assert sorted(after) == sorted(ref) and 0 in ref
    for r in ref:
        want = values(ref[r])
        assert sorted(want) == list(range(EPOCHS * PER_EPOCH))
        got = values(after[r])
        assert got == want, f"rank {r}: after the resume, " + differ(got, want)
        killed_part = values(before.get(r, []))
        assert killed_part == {i: want[i] for i in killed_part}, f"rank {r}: the killed attempt's " + differ(
            killed_part, want
        )
    assert read_jsonl(run.epochs) == read_jsonl(whole.epochs)
    assert summary["weights_sha256"] == reference["weights_sha256"], "the final weights differ"
