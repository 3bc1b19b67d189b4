"""The three reducers behind one interface: ``reduce(grad) -> (update, record)``."""

from gtopk.reducers.base import Reducer, SparseReducer, validate_density
from gtopk.reducers.dense import DenseReducer
from gtopk.reducers.gtopk import GTopKReducer
from gtopk.reducers.outcome import ReduceRecord
from gtopk.reducers.topk import TopKReducer

__all__ = [
    "DenseReducer",
    "GTopKReducer",
    "ReduceRecord",
    "Reducer",
    "SparseReducer",
    "TopKReducer",
    "validate_density",
]
