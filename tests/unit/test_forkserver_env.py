"""Which variables a fork server's workers cannot be handed late (``gtopk.run.forkserver``)."""

from __future__ import annotations

from gtopk.run.forkserver import import_time_env


def test_variables_read_at_import_are_told_from_those_read_when_used():
    environ = {
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "TORCH_SHOW_CPP_STACKTRACES": "1",  # read when an error is raised
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",  # read when CUDA allocates, in the worker
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/x",  # set by torch._dynamo's import itself
        "LD_PRELOAD": "x.so",
        "PYTHONHASHSEED": "0",
        "NCCL_DEBUG": "INFO",  # read when a communicator is made: handed over
        "GLOO_SOCKET_IFNAME": "lo",
        "CUDA_VISIBLE_DEVICES": "0",  # read when CUDA starts, in the worker
        "GTOPK_TIME_DILATION": "4",
        "MASTER_PORT": "29500",
    }
    assert set(import_time_env(environ)) == {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "LD_PRELOAD",
        "PYTHONHASHSEED",
    }


def test_a_launcher_that_imports_torch_dynamo_after_the_server_started_still_forks(monkeypatch):
    """torch._dynamo's import sets TORCHINDUCTOR_CACHE_DIR in the launcher: that alone must not
    make every later group spawn (a Fig. 6 sweep's ranks held 13x the private memory)."""
    import os

    from gtopk.run import forkserver

    before = forkserver.import_time_env(os.environ)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/elsewhere")
    assert forkserver.import_time_env(os.environ) == before
