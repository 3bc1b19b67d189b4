"""A compute profile named by path (``compute.profile=<file>``) is another machine's: the
H200's profile (``analysis/results/gpu/h200_profile.json``, keys ending in ``/cuda``) must
replay in a CPU job, and a file with two devices for the same model and batch must be
refused rather than one picked silently."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gtopk.records.compute_profiles import ProfileError
from gtopk.train.compute import profile_t_compute


def job(device: str = "cpu") -> SimpleNamespace:
    return SimpleNamespace(model_name="vgg16", batch_size=128, grad_accum=1, device=device)


def write(tmp_path, entries: dict) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({k: {"images_per_s": v} for k, v in entries.items()}))
    return str(path)


def test_another_devices_entry_is_replayed(tmp_path):
    path = write(tmp_path, {"vgg16/b128x1/cuda": 25_600.0, "vgg16/b64x1/cuda": 1.0, "resnet20/b128x1/cuda": 1.0})
    assert profile_t_compute(path, job("cpu")) == pytest.approx(128 / 25_600.0)


def test_the_jobs_own_device_wins(tmp_path):
    path = write(tmp_path, {"vgg16/b128x1/cuda": 25_600.0, "vgg16/b128x1/cpu": 640.0})
    assert profile_t_compute(path, job("cpu")) == pytest.approx(128 / 640.0)


def test_two_other_devices_are_refused(tmp_path):
    path = write(tmp_path, {"vgg16/b128x1/cuda": 25_600.0, "vgg16/b128x1/mps": 2_000.0})
    with pytest.raises(ProfileError, match="keep one device's entries"):
        profile_t_compute(path, job("cpu"))


def test_no_entry_for_the_model_and_batch_is_refused(tmp_path):
    path = write(tmp_path, {"vgg16/b64x1/cuda": 1.0})
    with pytest.raises(ProfileError, match="has no entry 'vgg16/b128x1/cpu'"):
        profile_t_compute(path, job("cpu"))


def test_the_committed_h200_profile_replays_on_the_cpu():
    t = profile_t_compute("analysis/results/gpu/h200_profile.json", job("cpu"))
    assert 0.001 < t < 0.05  # VGG-16 b128 on an H200: milliseconds, not the CPU's seconds
