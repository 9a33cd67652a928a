"""Records returned by the registry: :class:`SpaceInfo`, :class:`VersionInfo` and :class:`SteerInfo`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["SpaceInfo", "VersionInfo", "SteerInfo"]


@dataclass(frozen=True)
class SpaceInfo:
    """A named embedding space: its dimension and, optionally, the encoder that produces it."""

    name: str
    dim: int
    encoder: str | None = None
    query_prefix: str = ""
    passage_prefix: str = ""
    description: str = ""
    created_at: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class VersionInfo:
    """One immutable version of a map with its lineage.

    ``aliases`` and ``tags`` are the mutable annotations current at read time; ``deleted`` marks a
    soft-deleted version. ``artifact_path`` is relative to the registry's artifact folder.
    """

    name: str
    version: int
    source_space: str
    target_space: str
    source_dim: int
    target_dim: int
    method: str
    params: dict = field(default_factory=dict)
    random_state: int | None = None
    data_hashes: dict = field(default_factory=dict)
    package_version: str = ""
    created_at: str = ""
    metrics: dict = field(default_factory=dict)
    artifact_sha256: str = ""
    artifact_path: str = ""
    aliases: list[str] = field(default_factory=list)
    tags: dict = field(default_factory=dict)
    deleted: bool = False
    description: str = ""
    report_path: str | None = None
    inputs: dict = field(default_factory=dict)
    artifact_format: str = ""

    @property
    def ref(self) -> str:
        """``name:version``: a reference that always resolves to this version."""
        return f"{self.name}:{self.version}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SteerInfo:
    """One immutable version of a steer (``align.Steer`` or ``align.MeanShift``) with its lineage.

    ``rank`` is 0 for a mean-shift baseline. ``lens`` holds the lens computed at fit time over
    the fitting items (directions with their extreme items), or ``[]`` when there were none to name.
    """

    name: str
    version: int
    space: str
    dim: int
    rank: int
    method: str
    params: dict = field(default_factory=dict)
    random_state: int | None = None
    data_hashes: dict = field(default_factory=dict)
    package_version: str = ""
    created_at: str = ""
    metrics: dict = field(default_factory=dict)
    artifact_sha256: str = ""
    artifact_path: str = ""
    aliases: list[str] = field(default_factory=list)
    deleted: bool = False
    description: str = ""
    lens: list = field(default_factory=list)
    inputs: dict = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"

    def to_dict(self) -> dict:
        return asdict(self)
