"""Whether this data dir's artifact folder is the registry's: a replica with a data dir of its own on a shared
PostgreSQL registry reads versions whose files another replica wrote into another folder (QA 4801)."""

from __future__ import annotations

import time

from ..logging import get_logger
from .errors import ArtifactsElsewhereError

_log = get_logger("registry")

#: how many of the newest live versions' files :func:`artifacts_elsewhere` looks for
ARTIFACT_SAMPLE = 8
#: fewest files of the sample missing that say "another folder" (fewer are lost files, whatever share they are)
MIN_MISSING = 3
#: how long a verdict is reused: by a transform whose file is missing (one query and 8 ``stat``\ s each time
#: otherwise), and by /readyz (service/api/routers/ops.py) when it was "the registry's folder"; a successful read of
#: an artifact ends a "not the registry's" verdict at once (:meth:`~service.registry.store.ArtifactStore.get`)
VERDICT_S = 30.0


def artifacts_elsewhere(db, store, tables, sample: int = ARTIFACT_SAMPLE, *, max_age: float = 0.0,
                        keep_foreign: bool = True, said: bool = False) -> str | None:
    """Why this artifact folder is not the registry's, or None: :data:`MIN_MISSING` (3) or more, and half or more, of
    the ``sample`` newest distinct files of live versions (of the version ``tables``: maps' and steers',
    :data:`~service.registry.entity.VERSION_TABLES`) are not in it (one ``stat`` each).

    A folder that is not the registry's misses every version another replica wrote: all of the sample, as soon as
    the registry has three live versions. Lost files (a disk error, a partial restore) are one or two at a time: with
    a bare majority as the rule, one lost file of a registry of one or two live versions made /readyz 503 on every
    replica and its map's 500 a 503 "replicas must share ...". So fewer than 3 missing is never a foreign folder,
    whatever the share: a registry of one or two live versions cannot tell the two apart, and keeps the integrity
    error (500) a lost file always was, whose ``registry verify`` lists it.

    ``max_age``: reuse the verdict of a look at most that many seconds old (kept on ``store``, the one place it is
    kept: /readyz kept a copy of its own for 30 s more, so a folder put right stayed "not ready"); ``keep_foreign``
    False: a "not the registry's" verdict is not reused (/readyz: a replica not ready gets no traffic, no read of
    an artifact would end it). The newest come from
    ``created_at``, which has no index: the primary keys are (name, version), which order by name, not age, so
    they cannot stand in; at one query per :data:`VERDICT_S` per process (per /readyz probe while the verdict is
    "not the registry's", single-flight) a sort of the versions' rows costs less than an index every write would
    keep. The warning is logged when the verdict turns to "not the registry's", not at every look while it stands.
    The folder's path goes to the log only: clients and /readyz (no key needed) are told "this data dir's artifact
    folder". ``said``: the caller raises the verdict as its error (:func:`refuse_elsewhere`), so the warning names
    the folder only (the CLI printed the long text twice, the warning's and the error's)."""
    seen = store.elsewhere_seen
    if (max_age and seen is not None and time.monotonic() - seen[0] < max_age
            and (keep_foreign or seen[1] is None)):
        return seen[1]
    with db.tx() as t:  # distinct files: identical fits share one, whose loss is one lost file, not three (a review)
        rows = t.q("SELECT artifact_path, MAX(created_at) AS newest FROM (" + " UNION ALL ".join(
            f"SELECT artifact_path, created_at FROM {table} WHERE deleted = 0 AND collected_at IS NULL"
            for table in tables) + f") AS live GROUP BY artifact_path ORDER BY newest DESC LIMIT {int(sample)}")
    store._hook("artifacts_sampled")  # core.FAULT_HOOK: tests hang the folder here, as a hard NFS mount would
    missing = [r["artifact_path"] for r in rows if store.size(r["artifact_path"]) is None]
    why = None
    if len(missing) >= MIN_MISSING and 2 * len(missing) >= len(rows):
        why = (f"this data dir's artifact folder does not hold the registry's artifacts ({len(missing)} of the "
               f"{len(rows)} newest live versions' artifact files are not in it): replicas of one registry must share "
               "its artifact folder (vecbridge --artifact-dir or VECBRIDGE_ARTIFACT_DIR, default DATA_DIR/artifacts, "
               "on storage every replica mounts); if they do, files were lost: `vecbridge registry verify` lists them "
               "(`vecbridge registry delete` those versions, or restore their files, to write again)")
        if seen is None or seen[1] is None:  # once when the verdict turns, not at every probe while it stands
            if said:
                _log.warning("refused: this data dir's artifact folder %s does not hold the registry's artifacts",
                             store.root)
            else:
                _log.warning("%s (this data dir's artifact folder: %s)", why, store.root)
    store.elsewhere_seen = (time.monotonic(), why)
    return why


def refuse_elsewhere(db, store, tables, what: str) -> None:
    """Raise :class:`~.errors.ArtifactsElsewhereError` (503 / exit 2) ``"{what}: {why}"`` when a look made now
    (:func:`artifacts_elsewhere`, no kept verdict) says this artifact folder is not the registry's: a write (a fit's
    registration, an import) calls it before it stores anything. A fit from a replica with a data dir of its own
    wrote its artifact there, committed the version and moved the alias: every other replica answered that alias with
    a 500 "artifact missing" (QA s54). An empty registry, or one of one or two live versions, is never refused."""
    why = artifacts_elsewhere(db, store, tables, keep_foreign=False, said=True)
    if why:
        raise ArtifactsElsewhereError(f"{what}: {why}")


def aliased_missing(db, store, kinds, *, max_age: float = 0.0) -> str | None:
    """Why some alias cannot be served from this artifact folder, or None: the live versions an alias of ``kinds``
    (``(noun, aliases table, versions table)`` each, :data:`~service.registry.entity.ALIAS_TABLES`) points at whose
    files are not in it (one ``stat`` each), however few. Aliases are what serve traffic: /readyz said ready while
    ``m@prod`` answered every transform with a 500 "artifact missing" (its file 2 of the 8 newest missing, under
    :data:`MIN_MISSING`). An "all there" verdict is reused for ``max_age`` seconds (kept on ``store``); a missing one
    is looked at again each time. The names go to the log only (/readyz needs no key)."""
    seen = store.aliased_seen
    if max_age and seen is not None and seen[1] is None and time.monotonic() - seen[0] < max_age:
        return None
    with db.tx() as t:
        rows = t.q(" UNION ALL ".join(
            f"SELECT '{noun}' AS noun, a.name, a.alias, a.version, v.artifact_path FROM {aliases} a JOIN {table} v "
            "ON v.name = a.name AND v.version = a.version WHERE v.deleted = 0 AND v.collected_at IS NULL"
            for noun, aliases, table in kinds))
    missing = [r for r in rows if store.size(r["artifact_path"]) is None]
    why = None
    if missing:
        why = (f"the files of {len(missing)} of the {len(rows)} aliased versions are not in this data dir's artifact "
               "folder: transforms by those aliases fail; `vecbridge registry verify` lists the missing files (a "
               "replica must use the registry's artifact folder: --artifact-dir or VECBRIDGE_ARTIFACT_DIR)")
        if seen is None or seen[1] is None:
            _log.warning("%s: %s", why, ", ".join(f"{r['noun']} {r['name']}@{r['alias']} ({r['name']}:{r['version']})"
                                                  for r in missing[:20]))
    store.aliased_seen = (time.monotonic(), why)
    return why
