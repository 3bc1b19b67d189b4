"""Records are data, never code: a crafted run folder (summary.json, config.yaml) cannot make
the analyses load a config from a path of its choosing, instantiate a ``_target_`` or import
a module. Model names must be stems of ``conf/model/*.yaml`` and reducer classes
``_target_``s of ``conf/reducer/*.yaml``; anything else is refused in one line (or, where a
folder is analysed, that job or line is skipped with a warning). Each crafted config here
would create a marker if it ran; the tests assert that it does not exist."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

import gtopk.perf.model as perfmodel
from analysis import scaling
from analysis.load import load_jobs
from gtopk.perf.netprofile import NetworkProfile
from gtopk.reducers.costmodel import Network

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "conf" / "model"
#: the one-line refusal (ValueError where it does not exist, so that the markers decide)
Refused = getattr(perfmodel, "UnknownConfig", ValueError)
DENSE = {"_target_": "gtopk.reducers.DenseReducer", "bucket_mb": 25.0}
NET = Network(alpha=1e-3, beta=1e-8)


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "ran"


@pytest.fixture
def evil_model(tmp_path: Path, marker: Path) -> Path:
    """A model config whose net, once instantiated, creates ``marker``; its path without .yaml."""
    cfg = {"net": {"_target_": "os.makedirs", "_args_": [str(marker)]}, "input_shape": [3, 32, 32]}
    (tmp_path / "evil.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "evil"


def crafted_names(evil: Path) -> list[str]:
    """Names that at HEAD resolved ``conf/model/<name>.yaml`` to ``evil``.yaml."""
    rel = os.path.relpath(evil, MODEL_DIR)  # ../../../tmp/...
    return [str(evil), rel, f"resnet20/../{rel}"]


def evil_reducer(tmp_path: Path, marker: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A reducer config whose class lives in a module of the run folder itself (importable
    as a namespace package once its parent is on sys.path); importing it creates ``marker``."""
    pkg = tmp_path / f"crafted_runs_{tmp_path.name.replace('-', '_')}"
    (pkg / "job").mkdir(parents=True)
    (pkg / "job" / "evil_reducer.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).mkdir()\n\n\nclass Reducer:\n"
        "    overlaps_backward = False\n\n    @staticmethod\n    def predict_commu(*a, **k):\n        return 0.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return {"_target_": f"{pkg.name}.job.evil_reducer.Reducer"}


def attempt(fn) -> BaseException | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - what it raised is checked after the marker
        return e
    return None


def assert_refused(error: BaseException | None, what: str) -> None:
    assert isinstance(error, Refused), f"expected a one-line refusal of {what}, got {error!r}"
    assert "\n" not in str(error) and what in str(error)


def write_job(root: Path, name: str, model: str, reducer: dict, P: int, t_iter: float = 0.1) -> Path:
    d = root / name
    d.mkdir(parents=True)
    cfg = {"name": "crafted", "reducer": reducer, "reducer_name": "dense", "model_name": model, "nodes": P}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    summary = {
        "reducer": "dense",
        "model": model,
        "nodes": P,
        "density": 1.0,
        "params": 1000,
        "mode": "benchmark",
        "batch_per_worker": 10,
        "grad_accum_steps": 1,
        "cluster": "local",
        "compute": "replay",
        "t_data": 0.001,
        "t_compute": 0.05,
        "t_compr": 0.0,
        "t_commu": 0.01,
        "t_update": 0.001,
        "t_iter": t_iter,
        "images_per_s_per_worker": 10 / t_iter,
    }
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_a_model_name_outside_conf_model_loads_nothing(evil_model, marker):
    for name in crafted_names(evil_model):
        error = attempt(lambda name=name: perfmodel.model_shapes(name))
        assert not marker.exists(), f"model={name!r} instantiated the crafted config"
        assert_refused(error, "conf/model")


@pytest.mark.parametrize("name", ["..", "../resnet20", "resnet20/", "/etc/passwd", "", "a\nb", None, 3, ["resnet20"]])
def test_names_that_are_not_a_config_stem_are_refused(name):
    assert_refused(attempt(lambda: perfmodel.model_shapes(name)), "conf/model")


def test_compare_of_a_crafted_summary_instantiates_nothing(evil_model, marker):
    summary = json.loads(
        (write_job(evil_model.parent / "r", "j", str(evil_model), DENSE, 2) / "summary.json").read_text()
    )
    error = attempt(lambda: perfmodel.compare(summary, {"reducer": DENSE}, NET))
    assert not marker.exists()
    assert_refused(error, "conf/model")


def test_a_reducer_class_outside_conf_reducer_is_not_imported(tmp_path, marker, monkeypatch):
    crafted = evil_reducer(tmp_path, marker, monkeypatch)
    for call in (
        lambda: perfmodel.predict_commu(crafted, 4, 1000, NET),
        lambda: perfmodel.predict_iter(crafted, 4, 1000, NET, {}, 10),
        lambda: perfmodel.compare(json.loads(json.dumps(_summary("resnet20"))), {"reducer": crafted}, NET),
    ):
        error = attempt(call)
        assert not marker.exists(), "the crafted reducer module was imported"
        assert_refused(error, "conf/reducer")


def _summary(model: str) -> dict:
    return {
        "nodes": 2,
        "params": 1000,
        "batch_per_worker": 10,
        "grad_accum_steps": 1,
        "model": model,
        "t_commu": 0.01,
        "t_iter": 0.1,
    }


def test_the_perf_model_cli_skips_a_crafted_job_with_a_warning(tmp_path, evil_model, marker, monkeypatch, capsys):
    root = tmp_path / "runs"
    write_job(root, "good", "resnet20", DENSE, 2)
    write_job(root, "evil_model", str(evil_model), DENSE, 2)
    write_job(root, "evil_reducer", "resnet20", evil_reducer(tmp_path, marker, monkeypatch), 2)
    perfmodel.main(["--network", "paper", str(root)])
    assert not marker.exists()
    out, err = capsys.readouterr()
    assert out.count("resnet20") == 1  # the good job's row, and only it
    warnings = [line for line in err.splitlines() if line.startswith("warning: skipping")]
    assert (
        len(warnings) == 2 and any("evil_model" in w for w in warnings) and any("evil_reducer" in w for w in warnings)
    )


def test_scaling_leaves_out_crafted_lines_with_a_warning(tmp_path, evil_model, marker, monkeypatch, capsys):
    root = tmp_path / "runs"
    for P in (1, 2):
        write_job(root, f"good{P}", "resnet20", DENSE, P)
        write_job(root, f"evil_model{P}", str(evil_model), DENSE, P)
    crafted = evil_reducer(tmp_path, marker, monkeypatch)
    write_job(root, "evil_reducer", "resnet20", crafted, 2)
    jobs = load_jobs([root])
    jobs.loc[jobs["run_dir"].str.endswith("evil_reducer"), "reducer"] = "crafted"
    eff = scaling.efficiencies(jobs, NetworkProfile(alpha=1e-3, beta=1e-8, name="t"), extend_to=())
    assert not marker.exists()
    modelled = eff[eff["kind"] == "modelled"]
    assert set(modelled["model"]) == {"resnet20"} and set(modelled["reducer"]) == {"dense"}
    assert sorted(modelled["nodes"]) == [1, 2]
    assert len([line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]) == 2


def test_scaling_with_every_line_crafted_gives_no_modelled_rows(tmp_path, evil_model, marker):
    root = tmp_path / "runs"
    write_job(root, "evil1", str(evil_model), DENSE, 1)
    jobs = load_jobs([root])
    out = scaling.modelled(jobs, NetworkProfile(alpha=1e-3, beta=1e-8, name="t"), extend_to=())
    assert out.empty and not marker.exists()


def test_the_configs_names_still_work():
    stems = sorted(p.stem for p in MODEL_DIR.glob("*.yaml"))
    assert list(perfmodel.known_models()) == stems and "resnet20" in stems
    for stem in stems:
        assert perfmodel.check_model(stem) == stem
    shapes = perfmodel.model_shapes("resnet20")
    n = 0
    for s in shapes:
        k = 1
        for d in s:
            k *= d
        n += k
    assert n == 269_722  # ResNet-20's parameters (conf/model/resnet20.yaml)
    targets = {yaml.safe_load(p.read_text())["_target_"] for p in (ROOT / "conf" / "reducer").glob("*.yaml")}
    assert perfmodel.known_reducers() == targets
    assert perfmodel.predict_commu(DENSE, 4, 1000, NET) > 0
