"""The conformance kit's discovery and checks (docs/testing.md, "The conformance kit").

Reducers are found, never listed: ``names()`` is every ``conf/reducer/*.yaml`` and every
test-only example of ``EXAMPLES/reducer/*.yaml`` (``names(conf)``: those of one folder),
``node(name)`` its resolved config as ``run.py`` composes it (``tests.config.compose_config``;
an example's yaml on its own), and everything else comes from what its class declares
(``Reducer.declared``, ``reference``, ``simulatable``, ``overlaps_backward``). A check a
class cannot take (no ``reference``, not ``simulatable``) is skipped with that reason.

``real_steps`` runs on every rank of a real worker group (``gtopk.run.spawn``); everything
else here is local.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf
from torch import nn

from gtopk.perf import schedulecheck as sc
from gtopk.perf.schedulecheck import same_update
from tests.config import CONF, compose_config

M = 600  # entries of the kit's gradient
DENSITY = 0.02  # k = 12 of 600
STEPS = 3


#: test-only reducers, a conf-like folder (``reducer/<name>.yaml``): the kit checks them, run.py does not offer them
EXAMPLES = Path(__file__).resolve().parent / "examples"


def names(conf: Path | None = None) -> list[str]:
    """Every ``<conf>/reducer/*.yaml``, by name (None: ``conf/`` and ``EXAMPLES``)."""
    if conf is None:
        built_in, examples = names(CONF), names(EXAMPLES)
        assert not set(built_in) & set(examples), f"an example may not reuse a name of conf/reducer: {examples}"
        return built_in + examples
    return sorted(p.stem for p in (conf / "reducer").glob("*.yaml"))


@functools.cache
def node(name: str) -> dict:
    """The resolved ``reducer`` node of ``run.py reducer=<name> density=DENSITY`` (an example: its yaml)."""
    if (EXAMPLES / "reducer" / f"{name}.yaml").exists():
        return node_from(EXAMPLES / "reducer" / f"{name}.yaml")
    return OmegaConf.to_container(compose_config([f"reducer={name}", f"density={DENSITY}"]).reducer, resolve=True)


def schedule_case(name: str, **overrides) -> sc.Case:
    """``gtopk.perf.schedulecheck.case`` for an example (that one reads ``conf/reducer`` only)."""
    n = {k: v for k, v in node(name).items() if k != "density"}
    cls, settings = get_class(n.pop("_target_")), {**n, **overrides}
    return sc.Case(name, cls, settings, sc._skip(cls, settings))


def node_from(path: Path, density: float = DENSITY) -> dict:
    """A reducer yaml outside ``conf/`` resolved on its own (``${density}`` only)."""
    cfg = OmegaConf.merge({"density": density}, {"reducer": OmegaConf.load(path)})
    return OmegaConf.to_container(cfg.reducer, resolve=True)


def cls_of(n: dict) -> type:
    return get_class(n["_target_"])


def reference_skip(n: dict) -> str | None:
    """Why the reference checks cannot run for this config (None: they can)."""
    return None if cls_of(n).reference is not None else f"{n['_target_']} declares no reference"


def simulated_skip(n: dict) -> str | None:
    return None if cls_of(n).simulatable else f"{n['_target_']} is not simulatable"


def gradients(P: int, it: int, m: int = M) -> list[torch.Tensor]:
    """Every rank's gradient at step ``it`` (seeded: the same on every rank and in the parent)."""
    g = torch.Generator().manual_seed(7919 * it + P)
    return [torch.randn(m, generator=g) for _ in range(P)]


class Flat(nn.Module):
    """One parameter of m entries whose gradient is the input: ``backward`` of
    ``Flat()(g)`` leaves ``g`` in ``w.grad`` (DDP's hooks reduce it there)."""

    def __init__(self, m: int = M):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(m))

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return (self.w * g).sum()


def residual(reducer) -> torch.Tensor | None:
    """The error-feedback residual a reducer keeps (None: it keeps none)."""
    r = reducer.state_dict().get("residual")
    return r if isinstance(r, torch.Tensor) else None


def step(reducer, wrapped: nn.Module, model: Flat, g: torch.Tensor) -> torch.Tensor:
    """Collective with a process group. The training loop's step: backward of ``g``
    through the wrapped module (hooked reducers communicate here), then
    ``reduce(flat, out=flat)``; the update."""
    model.zero_grad(set_to_none=True)
    wrapped(g).backward()
    flat = model.w.grad.detach().clone()
    update, _ = reducer.reduce(flat, out=flat)
    return update.clone()


def real_steps(rank: int, P: int, nodes: dict[str, dict], steps: int = STEPS) -> dict[str, dict]:
    """Collective (every rank, same ``nodes``). Each config's reducer takes ``steps`` steps
    of ``gradients``; where it declares a reference, the update and this rank's residual are
    compared with it at every step (residuals carried). Returns, per config, the updates
    and the disagreements."""
    out = {}
    for name, n in nodes.items():
        reducer = instantiate(n)
        model = Flat()
        wrapped = reducer.wrap(model)
        has_ref = type(reducer).reference is not None
        kept, updates, failures = None, [], []
        for it in range(steps):
            grads = gradients(P, it)
            want = reducer.reference(grads, kept) if has_ref else None  # before reduce: its state
            update = step(reducer, wrapped, model, grads[rank])
            updates.append(update)
            if want is None:
                continue
            if not same_update(type(reducer), update, want[0]):
                failures.append(
                    f"{name} P={P} rank={rank} step {it}: update differs from the reference by "
                    f"{(update - want[0]).abs().max().item():.3g}"
                )
            mine = residual(reducer)
            if mine is not None and not torch.equal(mine, want[1][rank]):
                failures.append(f"{name} P={P} rank={rank} step {it}: residual differs from the reference")
            kept = want[1]
        out[name] = {"updates": updates, "failures": failures}
    return out


def simulated_updates(n: dict, P: int, steps: int = STEPS) -> list[torch.Tensor]:
    """Local. The same steps as ``real_steps`` by the class's ``reduce_group`` (P ranks in
    one process, ``cluster=simulated``)."""
    cls = cls_of(n)
    workers = [instantiate(n) for _ in range(P)]
    if hasattr(cls, "prepare_group"):  # the hook baselines: the model's bucket layout
        cls.prepare_group(workers, Flat(), (M,))
    return [cls.reduce_group(workers, [g.clone() for g in gradients(P, it)])[0].clone() for it in range(steps)]
