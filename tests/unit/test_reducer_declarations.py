"""Everything the analyses need about a reducer is declared by its class (``Reducer.declared``,
``gtopk/reducers/base.py``), for every ``conf/reducer/*.yaml`` (a new file joins these tests);
and no reducer name is written into the analyses or the runner's logic."""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra.utils import get_class, instantiate

import gtopk.reducers.base as base
from analysis import reducers as known
from gtopk.perf.model import predict_commu
from gtopk.reducers.base import Declared, Reducer
from gtopk.reducers.costmodel import Network
from tests.config import compose_config, options

ROOT = Path(__file__).resolve().parents[2]
NAMES = options("reducer")
SHAPES = [(64, 3, 3, 3), (64,), (10, 64)]  # a small model's parameters, for PowerSGD's cost model
M = sum(math.prod(s) for s in SHAPES)


@pytest.fixture(scope="module")
def cfgs() -> dict[str, dict]:
    """Each reducer's config node as a job gets it (density 0.01)."""
    return {n: dict(compose_config([f"reducer={n}", "density=0.01"]).reducer) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_each_reducer_declares_what_the_analyses_read(name, cfgs):
    cfg = cfgs[name]
    cls = get_class(cfg["_target_"])
    assert issubclass(cls, Reducer)
    d = cls.declared({k: v for k, v in cfg.items() if k != "_target_"})
    assert isinstance(d, Declared)
    assert d.display_name is None or (isinstance(d.display_name, str) and d.display_name.strip())
    assert isinstance(d.plot_order, float) and not math.isnan(d.plot_order)
    assert d.color is None or isinstance(d.color, str)
    for flag in ("exact_average", "overlaps_backward", "simulatable", "payoff_baseline", "has_reference"):
        assert isinstance(getattr(d, flag), bool), flag
    assert d.has_reference == (cls.reference is not None)
    # the alpha-beta cost comes from the class: nothing at P = 1, a positive time beyond
    net = Network(alpha=1e-4, beta=1e-9)
    times = [predict_commu(cfg, P, M, net, SHAPES) for P in (1, 2, 3, 8)]
    assert times[0] == 0.0 and all(math.isfinite(t) and t > 0 for t in times[1:]), times


def test_the_reducers_are_told_apart_and_ordered(cfgs):
    shown = {n: known.declared(n, cfgs[n]).display_name for n in NAMES}
    assert len(set(shown.values())) == len(NAMES), shown
    # the figures' order as it was before the declarations, gtopk_exact right after gtopk
    before = ["dense", "ddp", "ddp_fp16", "powersgd", "topk", "gtopk", "gtopk_exact"]
    assert [n for n in known.ordered(NAMES) if n in before] == before
    assert known.reference_baseline() == "ddp" and known.payoff_baselines()[:3] == ["ddp", "ddp_fp16", "powersgd"]
    assert [known.display(n) for n in before] == [
        "dense",
        "DDP",
        "DDP-fp16",
        "PowerSGD",
        "Top-k",
        "gTop-k",
        "gTop-k exact",
    ]
    assert known.display("gtopk putback=exact") == "gTop-k putback=exact"  # as the payoff verdicts wrote it


@pytest.mark.parametrize("name", NAMES)
def test_exact_average_is_what_the_reference_computes(name, cfgs):
    """A reducer that declares the exact average has a reference whose update is the mean of
    the gradients; one with a reference that does not declare it sends less (P = 3)."""
    reducer = instantiate(cfgs[name])
    d = type(reducer).declared(cfgs[name])
    if reducer.reference is None:
        assert not d.exact_average or d.payoff_baseline, "an exact average without a reference to check it"
        return
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(1000, generator=g) for _ in range(3)]
    update, kept = reducer.reference(grads, [None] * 3)
    mean = torch.stack(grads).sum(0) / 3
    assert torch.allclose(update, mean, atol=1e-6) == d.exact_average
    assert len(kept) == 3 and all(k.shape == grads[0].shape for k in kept)


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_is_what_one_worker_does(name, cfgs):
    """On one worker (no process group) ``reduce`` is what its ``reference`` says, step after
    step (the residual carried); P > 1 is the distributed tests' (gloo)."""
    reducer = instantiate(cfgs[name])
    if reducer.reference is None:
        pytest.skip(f"{name} declares no reference")
    g = torch.Generator().manual_seed(5)
    residual = None
    for _ in range(3):
        grad = torch.randn(1000, generator=g)
        expected, (kept,) = reducer.reference([grad], [residual])
        update, _ = reducer.reduce(grad.clone())
        residual = reducer.state_dict().get("residual")
        assert torch.allclose(update, expected, atol=1e-7)
        assert residual is None or torch.allclose(residual, kept, atol=1e-7)


def test_base_py_documents_every_declaration():
    doc = base.__doc__
    for name in [f.name for f in dataclasses.fields(Declared) if f.name != "has_reference"]:
        assert f"``{name}``" in doc, name
    for name in ("reference(grads, residuals)", "hooked_backward", "predict_commu"):
        assert f"``{name}" in doc, name


def test_a_record_whose_yaml_was_deleted_is_shown_with_the_defaults():
    gone = known.declared("oldk", {"_target_": "gtopk.reducers.oldk.OldKReducer", "density": 0.01})
    assert (gone.display_name, gone.plot_order, gone.exact_average) == ("oldk", math.inf, False)
    assert known.display("oldk rho=0.1") == "oldk rho=0.1" and known.ordered(["oldk", "dense"]) == ["dense", "oldk"]
    # the class of a deleted variant still exists: its record says which variant it was
    renamed = {"_target_": "gtopk.reducers.GTopKReducer", "density": 0.01, "putback": "exact"}
    assert known.declared("gtopk_lossless", renamed).display_name == "gTop-k exact"


def test_a_record_naming_a_class_outside_conf_reducer_imports_nothing(tmp_path, monkeypatch):
    """Records are data: the declarations of a class no ``conf/reducer`` yaml names are the
    defaults, and its module is never imported (it would create ``marker``)."""
    marker = tmp_path / "imported"
    pkg = tmp_path / f"crafted_{tmp_path.name.replace('-', '_')}"
    pkg.mkdir()
    (pkg / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).mkdir()\nclass R:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    crafted = {"_target_": f"{pkg.name}.evil.R"}
    frame = pd.DataFrame({"reducer": ["dense"], "reducer_cfg": [crafted]})
    assert known.declared("dense", crafted).exact_average is False and not known.exact_rows(frame).any()
    assert not marker.exists()


# -- no reducer name in the analyses or the runner's logic -----------------------------------
#: the code that must read reducers from their declarations (the runner: gtopk/run/*.py)
SCANNED = [*sorted((ROOT / "analysis").rglob("*.py")), *sorted((ROOT / "gtopk" / "run").glob("*.py"))]
SCANNED.append(ROOT / "gtopk" / "perf" / "model.py")


def name_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, text) of each string literal that is a reducer name, a list of them joined by
    ``,`` ``/`` or spaces (``"ddp,dense"``, ``"gtopk/dense"``), or an override choosing them
    (``"reducer=dense,topk"``); f-string parts included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts = [p for p in re.split(r"[,/\s=]+", node.value) if p]
            parts = parts[1:] if parts[:1] == ["reducer"] and "=" in node.value else parts
            if parts and all(p in names for p in parts):
                found.append((node.lineno, node.value))
    return sorted(found)


def test_the_scan_finds_a_registry_of_names():
    names = {"dense", "ddp", "gtopk"}
    code = 'ORDER = ("dense", "ddp")\nBASE = "ddp,dense"\nx = f"{y}gtopk/dense"\nok = "99 % of dense"\n'
    code += 'SWEEP = ["experiment=e", "reducer=dense,gtopk"]\nfine = f"reducer={which}"\n'
    found = [(1, "ddp"), (1, "dense"), (2, "ddp,dense"), (3, "gtopk/dense"), (5, "reducer=dense,gtopk")]
    assert name_literals(code, names) == found


def test_no_reducer_name_is_written_into_the_analyses_or_the_runner():
    names = set(NAMES)
    hits = [
        f"{p.relative_to(ROOT)}:{line}: {text!r}" for p in SCANNED for line, text in name_literals(p.read_text(), names)
    ]
    assert hits == [], "reducer names as literals (read them from the declarations, analysis.reducers):\n" + "\n".join(
        hits
    )
