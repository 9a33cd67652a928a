"""vecbridge.align — linear maps between embedding spaces (pure numerics).

Public surface::

    LinearMap, Frame                         maps and per-side frames
    fit_procrustes, fit_ridge, fit_lowrank   supervised fits from paired rows
    PairStats                                additive sufficient statistics (streaming / merging)
    MiniVec2Vec                              unsupervised (and seeded) alignment
    evaluate                                 held-out metrics
    knn, csls_knn, mutual_nn                 blocked neighbour search
    exceptions                               the typed error tree
"""

from . import exceptions
from .exceptions import *  # noqa: F401,F403
from .frames import Frame
from .knn import csls_knn, knn, mutual_nn
from .maps import LinearMap
from .metrics import evaluate, retention
from .procrustes import PairStats, fit_lowrank, fit_procrustes, fit_ridge

__version__ = "0.1.0"

__all__ = [
    "LinearMap", "Frame", "PairStats", "fit_procrustes", "fit_ridge", "fit_lowrank", "evaluate", "retention",
    "knn", "csls_knn", "mutual_nn", "exceptions", *exceptions.__all__,
]
