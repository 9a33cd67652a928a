"""Registry of linear maps: named spaces, maps with immutable numbered versions, aliases, tags, lineage, e.g.::

    from service.registry import open_registry
    reg = open_registry("sqlite:////tmp/reg.sqlite", "/tmp/artifacts")
    v = reg.register_version("minilm->e5", m, source_space="minilm", target_space="e5",
                             method="procrustes", params={}, alias="prod")
    reg.load_map("minilm->e5@prod")

Storage: SQL (SQLite (rollback journal) by default, PostgreSQL by URL) for records, a content-addressed
folder for artifacts (safetensors or npz + JSON header; never pickle). Maps and steers share one
version lifecycle (:mod:`.entity`) and one record definition (:mod:`.models`); see :mod:`.core` for
the crash-safe write path and :mod:`.errors` for the error tree. Modules import one way:
``core`` -> ``steers``, ``verify``, ``gc``, ``bundle`` -> ``entity`` -> ``models``, ``names``, ``errors``, ``cache``.
"""

from .core import Registry, open_registry, package_version
from .errors import (
    AliasMovedError,
    ArtifactsElsewhereError,
    ConflictError,
    DeletedVersionError,
    IntegrityError,
    InvalidNameError,
    NoReliableVersionError,
    NotFoundError,
    RegistryError,
    RegistryLockedError,
    RegistryUnavailableError,
)
from .models import Record, SpaceInfo, SteerInfo, VersionInfo
from .names import parse_ref

__all__ = [
    "Registry", "open_registry", "Record", "VersionInfo", "SpaceInfo", "SteerInfo", "RegistryError", "NotFoundError",
    "DeletedVersionError", "NoReliableVersionError", "ConflictError", "AliasMovedError", "InvalidNameError",
    "IntegrityError", "ArtifactsElsewhereError", "RegistryLockedError", "RegistryUnavailableError",
    "parse_ref", "package_version",
]
