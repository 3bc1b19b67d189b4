"""Ok-Topk S-SGD (Li and Hoefler, PPoPP 2022), docs/oktopk.md: the reducer (``reducer``), its
point-to-point rounds (``comm``), cost model (``cost``), in-process P ranks for
``cluster=simulated`` (``group``), executable specification (``reference``) and the region and
threshold arithmetic (``regions``)."""

from gtopk.reducers.oktopk.reducer import (
    BOUNDARY_PERIOD,
    DATA_SPREAD,
    STATE_KEYS,
    STEP0_OVER_AVERAGE,
    THRESHOLD_PERIOD,
    OkTopKReducer,
)

__all__ = [
    "BOUNDARY_PERIOD",
    "DATA_SPREAD",
    "STATE_KEYS",
    "STEP0_OVER_AVERAGE",
    "THRESHOLD_PERIOD",
    "OkTopKReducer",
]
