"""docs/new-reducer.md's worked example, taken from the page as it is: the class module and
its ``conf/reducer`` yaml are installed into a copy of ``conf/`` (never into the tree), the
reducer is built from the yaml and run on one worker against its own reference, and it
appears in Table IV with a modelled line from its own cost model. The slow test trains it on
two real worker processes and reads the run into the Fig. 5 table."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf

import gtopk.perf.model as perfmodel
from analysis import reducers as known
from gtopk.perf.netprofile import NetworkProfile
from gtopk.reducers.selection.exact import k_for

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "new-reducer.md"
NAME = "randomk"


def guide_files() -> dict[str, str]:
    """The page's code blocks that start with ``# file: <path>``, by path (that line dropped)."""
    blocks = re.findall(r"```\w*\n# file: (\S+)\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return {path: text for path, text in blocks}


def _clear_caches() -> None:
    perfmodel.known_reducers.cache_clear()
    perfmodel.known_models.cache_clear()
    known._conf.cache_clear()
    known._declared.cache_clear()


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The guide's two files: the module importable under its path's name, the yaml in a
    copy of ``conf/reducer`` that the analyses read (``gtopk.perf.model.CONF``)."""
    files = guide_files()
    module_path, yaml_path = sorted(files, key=lambda p: p.endswith(".yaml"))
    assert (module_path, yaml_path) == (f"gtopk/reducers/{NAME}.py", f"conf/reducer/{NAME}.yaml")
    source = tmp_path / f"{NAME}.py"
    source.write_text(files[module_path])
    module_name = module_path.removesuffix(".py").replace("/", ".")
    spec = importlib.util.spec_from_file_location(module_name, source)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, module_name, module)
    spec.loader.exec_module(module)
    conf = tmp_path / "conf"
    conf.mkdir()
    for sub in (ROOT / "conf").iterdir():
        if sub.name != "reducer":
            (conf / sub.name).symlink_to(sub)
    shutil.copytree(ROOT / "conf" / "reducer", conf / "reducer")
    (conf / yaml_path.split("/", 1)[1]).write_text(files[yaml_path])
    monkeypatch.setattr(perfmodel, "CONF", conf)
    _clear_caches()
    yield {"module": module, "yaml": yaml.safe_load(files[yaml_path]), "files": files, "source": source}
    _clear_caches()


def build(cfg: dict, density: float):
    return instantiate(OmegaConf.create({"density": density, "reducer": cfg}).reducer)


def test_the_guide_says_how_many_lines_the_example_took(installed):
    text = GUIDE.read_text()
    for path, body in installed["files"].items():
        kind = "class" if path.endswith(".py") else "config"
        n = len(body.splitlines())
        assert re.search(rf"{kind}, {n} lines", text), f"the guide should say its {kind} is {n} lines"


def test_the_example_runs_on_one_worker_as_its_reference_says(installed):
    r = build(installed["yaml"], density=0.1)
    assert type(r).__module__ == f"gtopk.reducers.{NAME}" and r.world_size == 1
    m, k = 1000, k_for(0.1, 1000)
    g = torch.Generator().manual_seed(0)
    residual = None
    for _ in range(3):
        grad = torch.randn(m, generator=g)
        expected, (kept,) = r.reference([grad], [residual])
        before = torch.zeros(m) if residual is None else residual.clone()
        update, rec = r.reduce(grad.clone())
        residual = r.state_dict()["residual"]
        assert torch.equal(update, expected) and torch.equal(residual, kept)
        assert int((update != 0).sum()) == k == rec.selected
        assert torch.allclose(update + residual, before + grad)  # nothing lost (P = 1)
    state = r.state_dict()
    again = build(installed["yaml"], density=0.1)
    again.load_state_dict(state)
    assert torch.equal(again.indices(m), r.indices(m))  # a resumed job draws what it would have
    with pytest.raises(ValueError, match=r"reducer\.seed=-1"):
        type(r)(density=0.1, seed=-1)


ALPHA, BETA, M = 1e-3, 1e-8, 1_000_000
T_ITER = {("ddp", 1): 0.100, ("ddp", 2): 0.110, ("gtopk", 1): 0.100, ("gtopk", 2): 0.112}
T_ITER.update({(NAME, 1): 0.101, (NAME, 2): 0.120})


def bench_job(root: Path, reducer: str, cfg: dict, P: int) -> None:
    d = root / f"nodes={P},reducer={reducer}"
    d.mkdir(parents=True)
    config = {"name": "guide", "reducer": cfg, "reducer_name": reducer, "model_name": "resnet20", "nodes": P}
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    t_iter = T_ITER[reducer, P]
    local = {"t_data": 0.001, "t_compute": 0.08, "t_compr": 0.005, "t_update": 0.004}
    summary = {"reducer": reducer, "model": "resnet20", "nodes": P, "density": 0.001, "params": M, **local}
    summary.update(mode="benchmark", batch_per_worker=100, grad_accum_steps=1, cluster="emulated", compute="replay")
    summary.update(t_commu=t_iter - sum(local.values()), t_iter=t_iter, images_per_s_per_worker=100 / t_iter)
    (d / "summary.json").write_text(json.dumps(summary))


def test_the_example_appears_in_table4_with_its_own_cost_model(installed, tmp_path):
    from analysis.figures import table4

    root = tmp_path / "runs"
    resolved = {n: {**known.conf_reducers()[n], "density": 0.001} for n in ("ddp", "gtopk", NAME)}
    for reducer, P in T_ITER:
        bench_job(root, reducer, resolved[reducer], P)
    profile = tmp_path / "profile.json"
    NetworkProfile(alpha=ALPHA, beta=BETA, name="t").save(profile)
    table4.main([str(root), "--network", str(profile), "--extend", "8"])
    t = json.loads(json.dumps(__import__("pandas").read_csv(root / "analysis" / "table4.csv").to_dict("records")))
    measured = next(r for r in t if r["kind"] == "measured" and r["nodes"] == 2)
    assert measured[f"e_{NAME}"] == pytest.approx(0.100 / 0.120)  # v_1: DDP's P = 1 job
    assert measured[f"{NAME}/gtopk"] == pytest.approx(0.112 / 0.120)  # the last in plot order is the subject
    modelled = next(r for r in t if r["kind"] == "modelled" and r["nodes"] == 8)
    ring = 2 * 7 * (ALPHA + math.ceil(1000 / 8) * 4 * BETA)  # its predict_commu: ring all-reduce of k = 1000
    check = 2 * 7 * (ALPHA + 4 * BETA)  # the loop's non-finite check: a ring all-reduce of 8 flags
    t_iter = 0.101 + ring + check  # its P = 1 job's step (whose t_commu is local work), the all-reduce, the check
    assert modelled[f"e_{NAME}"] == pytest.approx(0.100 / t_iter)
    assert known.display(NAME) == "random-k" and known.ordered([NAME, "gtopk", "dense"])[-1] == NAME


def _train(rank: int, world: int, module_source: str, cfg: dict, run_dir: str):
    """A worker of the slow test: the guide's module importable here too, then the job."""
    spec = importlib.util.spec_from_file_location(f"gtopk.reducers.{NAME}", module_source)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from gtopk.train.loop import run_worker

    return run_worker(rank, world, cfg, run_dir)


@pytest.mark.slow
def test_the_example_trains_on_two_workers_and_joins_the_fig5_table(installed, tmp_path):
    from analysis.figures.curves import load_curves, table
    from gtopk.run.spawn import spawn
    from tests.config import compose_config

    overrides = ["mode=train", "nodes=2", "data=digits", "data.image_size=16", "data.train_size=160"]
    overrides += ["data.test_size=40", "batch_size=8", "train.epochs=2", "train.max_iters_per_epoch=3"]
    overrides += ["train.loader_workers=0", "density=0.05", "threads_per_worker=1", "device=cpu"]
    cfg = OmegaConf.to_container(compose_config(overrides), resolve=True)
    cfg["reducer"] = {**installed["yaml"], "density": 0.05}
    cfg["reducer_name"] = NAME
    run_dir = tmp_path / "runs" / "guide" / NAME
    run_dir.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(cfg), run_dir / "config.yaml")
    summary = spawn(_train, 2, (str(installed["source"]), cfg, str(run_dir)), timeout=300)[0]
    assert summary["weights_identical_across_ranks"] and summary["reducer"] == NAME
    rows = table(load_curves([tmp_path / "runs"]))
    assert list(rows["label"]) == [f"{NAME} rho=0.05 P=2"] and rows["runs"].iloc[0] == 1
    assert rows["coverage"].iloc[0] > 0  # its diagnostics reached the records (update_nnz per step)
