"""Network profiles: alpha (s per message), beta (s per byte), the sparse rounds' software
cost and the backend's ring step (at the pair's P and with P ranks up) that
``gtopk.perf.netbench`` measures on a cluster, saved as JSON; and the alpha-beta fit of its
ping-pong. The model (``gtopk.perf.model``) predicts from them. Local: nothing runs."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from gtopk.records.rundir import write_json_atomic
from gtopk.reducers.costmodel import Network

NO_SOFTWARE = "no per-message software cost measured (made before netbench measured it): taken as 0"


@dataclass
class NetworkProfile:
    """alpha (s), beta (s/byte), software (s per message of the sparse reducers' own rounds
    beyond alpha: ``gtopk.perf.software``) and where they came from."""

    alpha: float
    beta: float
    name: str = "custom"
    cluster: dict = field(default_factory=dict)
    backend: str = ""  # the torch.distributed backend measured (gloo, nccl); "" when not measured
    samples: list = field(default_factory=list)  # [(bytes, one-way seconds)] behind the fit
    notes: str = ""
    software: float = 0.0
    software_samples: list = field(default_factory=list)  # seconds per message, one per timed reduce
    software_notes: str = ""  # how it was measured
    ring_alpha: float | None = None  # s per step of the backend's own ring collectives (None: alpha)
    ring_alpha_at: dict = field(default_factory=dict)  # {P: s per ring step measured with P ranks up}

    @property
    def network(self) -> Network:
        """The network at the ping-pong's P (``ring_alpha``); ``network_at`` for a given P."""
        return Network(alpha=self.alpha, beta=self.beta, software=self.software, ring_alpha=self.ring_alpha)

    def ring_step(self, P: int) -> float | None:
        """The ring step's latency the model uses at P: the one measured with P ranks up
        (``ring_alpha_at``), else the one measured at the nearest P on a log2 scale (ties: the
        larger P; beyond the largest measured P, the largest's), else ``ring_alpha``."""
        if not self.ring_alpha_at:
            return self.ring_alpha
        at = {int(p): float(v) for p, v in self.ring_alpha_at.items()}
        nearest = min(at, key=lambda q: (abs(math.log2(q) - math.log2(max(P, 1))), -q))
        return at[nearest]

    def network_at(self, P: int) -> Network:
        """The network the model uses for a job of P ranks (its ring step: ``ring_step``)."""
        return dataclasses.replace(self.network, ring_alpha=self.ring_step(P))

    @property
    def bits_per_s(self) -> float:
        return 8.0 / self.beta if self.beta > 0 else math.inf

    @classmethod
    def paper(cls) -> NetworkProfile:
        n = Network.paper()
        return cls(
            alpha=n.alpha,
            beta=n.beta,
            name="paper",
            notes="the authors' fit on their 32-node 1 Gbit/s Ethernet cluster",
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> NetworkProfile:
        """A profile file, or ``paper`` for the authors' published fit."""
        if str(path) == "paper":
            return cls.paper()
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(
                f"network profile {p} does not exist; make one with "
                "`python -m gtopk.perf.netbench cluster=...` or pass `paper`"
            )
        d = json.loads(p.read_text())
        if "software" not in d:  # a profile from before netbench measured it
            d["software_notes"] = NO_SOFTWARE
            print(f"note: {p}: {NO_SOFTWARE}", file=sys.stderr)
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def fit_alpha_beta(
    sizes: Sequence[float], times: Sequence[float], small: float = 8192, large: float = 1 << 20
) -> tuple[float, float]:
    """Fit ``t = alpha + beta * n`` to one-way times of messages of ``sizes`` bytes.

    beta is the least-squares slope over the messages of at least ``large`` bytes (where
    bandwidth dominates); alpha is ``t - beta * n`` of the smallest message, where it has
    at most ``small`` bytes (what a tiny message costs). Mid-sized messages are left out of
    both: a token-bucket shaper lets them run ahead of the rate for ``burst`` bytes, which
    would bend a single line, and would take beta x n off a small one that never paid it
    (an emulated 100 Mbit/s link's 8 KiB message: 0.69 ms; alpha came out at 0.02 ms as the
    median of t - beta x n over 8 B, 1 KiB and 8 KiB). With fewer than two large sizes or no
    small one, a plain least-squares line over all points is returned."""
    if len(sizes) != len(times) or len(set(sizes)) < 2:
        raise ValueError("fit_alpha_beta needs at least two distinct message sizes")
    big = [(n, t) for n, t in zip(sizes, times) if n >= large]
    tiny = [(n, t) for n, t in zip(sizes, times) if n <= small]
    if len({n for n, _ in big}) < 2 or not tiny:
        big, tiny = list(zip(sizes, times)), []
    xs, ys = [n for n, _ in big], [t for _, t in big]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if not tiny:
        return my - beta * mx, beta
    n, t = min(tiny)
    return t - beta * n, beta
