"""vecbridge.align — linear maps between embedding spaces (pure numerics).

Public surface::

    LinearMap, Frame                         maps and per-side frames
    fit_procrustes, fit_ridge, fit_lowrank   supervised fits from paired rows
    PairStats                                additive sufficient statistics (streaming / merging)
    MiniVec2Vec                              unsupervised (and seeded) alignment
    evaluate, cross_val_top1                 held-out metrics (a map; k-fold cross-validation of a fitter)
    fit_migration, score_map                 migration maps chosen on held-out pairs (families × objectives)
    labelled_retention                       retention of labelled retrieval (queries + relevant rows) for a CI gate
    corpus_retention                         the same over the whole corpus (the rest of it mapped), as planned
    ClusterMap                               blended per-cluster local maps (fit_migration(method="cluster"))
    MapChain, require_linear                 maps of any kind applied in sequence; the check for matrix-only uses
    load_map, map_from_bytes                 read a stored LinearMap, ClusterMap or MapChain by its header
    select_rows_to_embed, knn_overlap,       which rows to re-embed, alignability,
    plan_migration                           expected retention vs K before the fit
    keep_native_rows                         the re-embedded rows' own vectors back into the migrated corpus
    fit_steer, Steer, transfer_steer         LM-Steer style query transforms
    knn, csls_knn, mutual_nn                 blocked neighbour search
    exceptions                               the typed error tree
"""

from . import exceptions
from .exceptions import *  # noqa: F401,F403
from .chain import MapChain, map_kind, require_linear
from .cluster import ClusterMap
from .corpus_retention import corpus_retention
from .coverage import keep_native_rows
from .frames import Frame
from .knn import csls_knn, knn, mutual_nn
from .maps import LinearMap, load_map, map_from_bytes
from .metrics import cross_val_top1, evaluate, retention
from .migration import fit_migration, labelled_retention, score_map
from .minivec2vec import MiniVec2Vec
from .plan import knn_overlap, plan_migration, select_rows_to_embed
from .procrustes import PairStats, fit_lowrank, fit_procrustes, fit_ridge
from .steer import MeanShift, Steer, apply_steers, compose_steers, fit_mean_shift, fit_steer, transfer_steer

__version__ = "0.1.0"

__all__ = [
    "LinearMap", "ClusterMap", "MapChain", "map_kind", "require_linear", "load_map", "map_from_bytes", "Frame", "PairStats", "fit_procrustes", "fit_ridge", "fit_lowrank", "evaluate", "retention",
    "cross_val_top1",
    "MiniVec2Vec", "fit_migration", "score_map", "labelled_retention",
    "corpus_retention", "select_rows_to_embed", "keep_native_rows", "knn_overlap", "plan_migration", "Steer",
    "MeanShift", "fit_steer", "fit_mean_shift", "compose_steers", "apply_steers",
    "transfer_steer", "knn", "csls_knn", "mutual_nn", "exceptions", *exceptions.__all__,
]
