"""Which variables a fork server's workers cannot be handed late (``gtopk.run.forkserver``)."""

from __future__ import annotations

from gtopk.run.forkserver import import_time_env


def test_variables_read_at_import_are_told_from_those_read_when_used():
    environ = {
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "LD_PRELOAD": "x.so",
        "NCCL_DEBUG": "INFO",  # read when a communicator is made: handed over
        "GLOO_SOCKET_IFNAME": "lo",
        "CUDA_VISIBLE_DEVICES": "0",  # read when CUDA starts, in the worker
        "GTOPK_TIME_DILATION": "4",
        "MASTER_PORT": "29500",
    }
    assert set(import_time_env(environ)) == {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "TORCH_SHOW_CPP_STACKTRACES",
        "PYTORCH_CUDA_ALLOC_CONF",
        "LD_PRELOAD",
    }
