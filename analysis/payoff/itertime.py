"""The time side of ``analysis.payoff``: networks, compute profiles, and the time per
iteration of a model and reducer at P on one network with one compute profile.

t_iter is *measured* when a finished benchmark job (``mode=benchmark``, e.g. those of
``make reproduce-fig6``) ran that model, reducer config (density included), P, per-worker
batch and accumulation on the network's cluster (every setting in the profile's
``cluster`` equal in the job's summary) with that compute profile (replay of it, or for
the local profile real compute); the median t_iter over such jobs. Otherwise it is
*modelled* (``gtopk.perf.model.predict_iter``): t_compute from the compute profile for
this batch; t_data, t_compr and the rest of the step (update, flattening, the non-finite
check) from the benchmark job of that model and reducer config with the fewest workers
(as ``analysis.scaling`` does), else from the convergence run's own steps as one rank's
(``training_overheads``); t_commu from the reducer's alpha-beta formula on the network.
"""

from __future__ import annotations

import json
import statistics
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from analysis.reducers import declared
from analysis.scaling import rest_of_iteration
from analysis.training import TrainRun
from gtopk.paper import single_node_throughput
from gtopk.perf.model import model_shapes, predict_iter
from gtopk.perf.netprofile import NetworkProfile
from gtopk.records.compute_profiles import LOCAL_PROFILE
from gtopk.records.rundir import finished
from gtopk.records.summary import SIMULATED_BACKEND

#: the bandwidth sweep, Gbit/s, at the calibrated profile's alpha and software cost
SWEEP_GBPS = (0.1, 1.0, 10.0, 100.0)


def ran_on(summary: dict, cluster: dict) -> bool:
    """Whether a job (its summary) ran on the cluster of a network profile: every setting of
    the profile's ``cluster`` equal in the summary."""
    return all(k in summary and summary[k] == v for k, v in cluster.items())


@dataclass(frozen=True)
class Net:
    """One network of the analysis: a calibrated profile, or a point of the sweep."""

    name: str
    alpha: float
    beta: float
    calibrated: bool
    cluster: dict = field(default_factory=dict, hash=False, compare=False)
    software: float = 0.0  # s per message of the sparse reducers' own rounds (``Network.software``)
    ring_alpha: float | None = None  # s per step of the backend's own ring collectives (``Network.ring_alpha``)
    ring_alpha_at: dict = field(default_factory=dict, hash=False, compare=False)  # {P: ring step at P}

    @property
    def gbps(self) -> float:
        return 8.0 / self.beta / 1e9

    @property
    def profile(self) -> NetworkProfile:
        return NetworkProfile(
            alpha=self.alpha,
            beta=self.beta,
            name=self.name,
            cluster=dict(self.cluster),
            software=self.software,
            ring_alpha=self.ring_alpha,
            ring_alpha_at=dict(self.ring_alpha_at),
        )


def networks(profiles: Sequence[NetworkProfile], sweep: Iterable[float] = SWEEP_GBPS) -> list[Net]:
    """The calibrated profiles (named ``<name> (<Gbit/s>)``), then the sweep at the first
    profile's alpha, software cost and ring steps (named ``<Gbit/s> Gbit/s``)."""
    nets = [net_of_profile(p, f"{p.name} ({8 / p.beta / 1e9:.3g} Gbit/s)") for p in profiles]
    first = nets[0]
    return nets + [
        replace(first, name=f"{g:g} Gbit/s", beta=8.0 / (g * 1e9), calibrated=False, cluster={}) for g in sweep
    ]


def net_of_profile(p: NetworkProfile, name: str | None = None) -> Net:
    """A calibrated profile as a ``Net`` (named ``name``, else the profile's)."""
    return Net(name or p.name, p.alpha, p.beta, True, dict(p.cluster), p.software, p.ring_alpha, dict(p.ring_alpha_at))


class ComputeProfile(ABC):
    """Where t_compute comes from: the paper's P102 throughput, or a local profile file."""

    name = "compute"

    @abstractmethod
    def t_compute(self, model: str, batch: int, accum: int) -> float | None:
        """Seconds of forward + backward per step; None when the profile has no entry."""

    @abstractmethod
    def ran(self, summary: dict) -> bool:
        """Whether a benchmark job (its summary) ran with this compute."""


class P102(ComputeProfile):
    """The paper's single-P102 throughput (``gtopk.paper``): t_compute = images / (images/s)."""

    name = "p102"

    def __init__(self) -> None:
        self.table = single_node_throughput()

    def t_compute(self, model, batch, accum):
        return batch * accum / self.table[model] if model in self.table else None

    def ran(self, summary):
        return summary.get("compute") == "replay" and summary.get("compute_profile") == "p102"


class LocalProfile(ComputeProfile):
    """A ``runs/profiles/local.json``-format file (``gtopk.run.measure_compute``): the entry of
    this model, batch and accumulation (any device) gives images/s."""

    def __init__(self, path: Path, arg: str):
        self.path, self.arg = Path(path), arg  # arg: as given (``local`` or the path)
        self.name = arg if arg == "local" else self.path.stem
        self.table = json.loads(self.path.read_text())

    def t_compute(self, model, batch, accum):
        prefix = f"{model}/b{batch}x{accum}/"
        key = next((k for k in sorted(self.table) if k.startswith(prefix)), None)
        return batch * accum / float(self.table[key]["images_per_s"]) if key else None

    def ran(self, summary):
        if summary.get("compute") == "replay":
            return summary.get("compute_profile") == self.arg
        return summary.get("compute") == "measured" and self.path.resolve() == LOCAL_PROFILE.resolve()


def compute_profile(arg: str) -> ComputeProfile:
    """``p102``, ``local`` (runs/profiles/local.json) or a path to a file of that format;
    a missing file is a one-line error."""
    if arg == "p102":
        return P102()
    path = LOCAL_PROFILE if arg == "local" else Path(arg)
    if not path.exists():
        raise SystemExit(
            f"--compute {arg}: {path} does not exist; measure it with a compute.profile=local job, or use --compute p102"
        )
    return LocalProfile(path, arg)


@dataclass(frozen=True)
class Reducer:
    """A reducer of the analysis, and the training runs whose steps stand in for its
    overheads when no benchmark job has them."""

    label: str
    cfg: dict = field(hash=False, compare=False)
    fallback: dict = field(default_factory=dict, hash=False, compare=False)  # overheads of a training run
    fallback_from: str = field(default="training run", compare=False)  # where ``fallback`` came from

    @classmethod
    def trained(cls, label: str, cfg: dict, run: TrainRun) -> Reducer:
        """The reducer ``label`` (config ``cfg``) whose fallback overheads are one rank's
        of training run ``run`` (``training_overheads``)."""
        over, source = training_overheads(run)
        return cls(label, cfg, over, source)


def training_overheads(run: TrainRun) -> tuple[dict, str]:
    """One rank's t_data, t_compr and rest of the step (``t_update``) from a training run's
    own steps (``run.overheads``), and where they came from.

    A simulated run (``cluster=simulated``: P virtual ranks in one process) records as
    t_update the step's shared part. For a reducer whose communication runs inside backward
    (``overlaps_backward``: DDP's hooks, e.g. DDP-fp16's casts), that part holds the P
    ranks' hook calls, made one after another (``gtopk.simulated.hooks.hook_group``) and
    timed for none of them, where a real rank makes its own only, inside its backward: so
    one rank's is t_update / P, the equal share the simulation gives each rank of the
    batched backward (t_compute) and the check. (It leaves (P - 1) / P of the group's one
    SGD step out.) Other reducers' group steps time each rank's own work as its t_compr
    (``gtopk.reducers.inprocess``); their t_update is kept."""
    over = dict(run.overheads)
    if not over or run.nodes <= 1 or run.backend != SIMULATED_BACKEND:
        return over, "training run"
    if not declared(run.reducer_name, run.reducer_cfg).overlaps_backward:
        return over, "training run"
    over["t_update"] = over["t_update"] / run.nodes
    return over, f"training run, t_update / {run.nodes} (its {run.nodes} simulated ranks' hooks)"


class IterTimes:
    """t_iter of (model, reducer, P, batch) on a network with a compute profile, from the
    finished benchmark jobs under some roots (measured) or the model."""

    def __init__(self, bench_roots: Sequence[str | Path]):
        self.jobs = []
        self._overheads: dict = {}
        for d in finished(bench_roots):
            summary = d.read_summary()
            if summary.get("mode") == "benchmark":
                self.jobs.append((summary, dict(d.read_config()["reducer"]), str(d.path)))

    def _of(self, model: str, reducer_cfg: dict) -> list[tuple[dict, dict, str]]:
        return [j for j in self.jobs if j[0]["model"] == model and j[1] == reducer_cfg]

    def measured(
        self, model: str, reducer_cfg: dict, P: int, batch: int, accum: int, net: Net, compute: ComputeProfile
    ) -> float | None:
        """Median t_iter of the benchmark jobs that ran exactly this on the net's cluster."""
        if not net.cluster:
            return None
        ts = [
            s["t_iter"]
            for s, _, _ in self._of(model, reducer_cfg)
            if int(s["nodes"]) == P
            and int(s["batch_per_worker"]) == batch
            and int(s.get("grad_accum_steps", 1)) == accum
            and compute.ran(s)
            and ran_on(s, net.cluster)
        ]
        return statistics.median(ts) if ts else None

    def overheads(self, model: str, reducer: Reducer) -> tuple[dict, str] | None:
        """(t_data, t_compr, t_update) of the reducer's benchmark jobs with the fewest
        workers, else of its training run; None when neither has them."""
        key = (model, json.dumps([reducer.cfg, reducer.fallback], sort_keys=True))
        if key not in self._overheads:
            self._overheads[key] = self._find_overheads(model, reducer)
        return self._overheads[key]

    def _find_overheads(self, model: str, reducer: Reducer) -> tuple[dict, str] | None:
        jobs = self._of(model, reducer.cfg)
        if jobs:
            fewest = min(int(s["nodes"]) for s, _, _ in jobs)
            at = [s for s, _, _ in jobs if int(s["nodes"]) == fewest]
            df = pd.DataFrame(at)
            out = {k: float(df[k].median()) for k in ("t_data", "t_compr")}
            out["t_update"] = rest_of_iteration(df, commu_is_local=fewest == 1)
            return out, f"benchmark P={fewest}"
        if reducer.fallback:
            return reducer.fallback, reducer.fallback_from
        return None

    def modelled(
        self,
        model: str,
        params: int,
        reducer: Reducer,
        P: int,
        batch: int,
        accum: int,
        net: Net,
        compute: ComputeProfile,
    ) -> tuple[dict | None, str]:
        """The model's prediction at P, never a measurement (``predict_iter``'s t_commu and
        t_iter, with the local times it used: t_data, t_compute, t_compr, t_update), and
        where its inputs came from; (None, why) when it cannot predict."""
        t_compute = compute.t_compute(model, batch, accum)
        if t_compute is None:
            return None, f"{compute.name} has no compute time for {model} b{batch}x{accum}"
        over = self.overheads(model, reducer)
        if over is None:
            return None, f"no benchmark job or training steps of {reducer.label} for its overheads"
        local, where = over
        local = {**local, "t_compute": t_compute}
        try:  # PowerSGD's model needs the layers: the model's config
            pred = predict_iter(
                reducer.cfg, P, params, net.profile.network_at(P), local, batch * accum, model_shapes(model)
            )
        except ValueError as e:
            return None, str(e)
        return {**local, **pred}, f"t_compute {compute.name}, overheads {where}"

    def t_iter(
        self,
        model: str,
        params: int,
        reducer: Reducer,
        P: int,
        batch: int,
        accum: int,
        net: Net,
        compute: ComputeProfile,
    ) -> tuple[float | None, str, str]:
        """(t_iter, source: measured | modelled | none, detail)."""
        t = self.measured(model, reducer.cfg, P, batch, accum, net, compute)
        if t is not None:
            return t, "measured", "benchmark job"
        pred, detail = self.modelled(model, params, reducer, P, batch, accum, net, compute)
        return (None, "none", detail) if pred is None else (pred["t_iter"], "modelled", detail)
