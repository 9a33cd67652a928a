"""``registry verify``: is a registry whole? Its database file, every version's artifact, every alias, the version
numbers of each map and steer."""

from __future__ import annotations

from .errors import IntegrityError

__all__ = ["verify_registry"]

GONE = "deleted version whose files are gone: `vecbridge registry gc` records it as collected"


def verify_registry(reg, sweep: bool = False) -> dict:
    """Check the database file (SQLite: ``PRAGMA quick_check``), every version's artifact (exists, sha256
    matches) and every alias's target; ``sweep=True`` also deletes the temporary files no writer has touched for
    ``store.STALE_TMP_S`` (10 minutes: a younger one may be a running writer's).

    Returns ``{"ok", "database", "bad_artifacts", "dangling_aliases", "aliases_on_deleted", "deleted_files_gone",
    "version_gaps", "orphan_artifacts"`` (lists), ``"tmp_files", "n_versions", "n_steer_versions", "n_collected",
    "n_deleted"}`` and ``"missing_reports"`` (maps and steers alike; deleted: those whose files ``registry gc``
    has not removed yet, collected: those it has, whose artifacts are not looked for). ``orphan_artifacts``: files
    no version names but a collected one (the next ``registry gc`` removes them) or none at all (a writer killed
    between storing its artifact and committing its row: ``registry gc --orphans`` removes them once untouched for
    ``store.STALE_TMP_S``).
    ``database``: what ``quick_check`` found; then no row is read (lists empty, counts None).
    ``aliases_on_deleted`` (``name@alias -> N``): aliases left on a deleted version, legal (a delete keeps them,
    for lineage) and not a failure, but such an alias no longer resolves. ``deleted_files_gone`` (``name:N: why``):
    deleted versions, not collected, whose artifact is missing: not a failure either (nothing reads a deleted
    version's files): a registry restored from a dump taken before a ``registry gc`` that removed them, beside a copy
    of the artifacts taken after it; ``registry gc`` marks them collected. A deleted version's artifact that is there
    but corrupt is a bad artifact. ``missing_reports`` (``name:N: why``): live map versions whose recorded fit report
    is not there (a writer killed between its commit and the report's write, a report folder not restored): a warning,
    not a failure (the map serves; ``GET .../report`` is a 404); it was not listed at all."""
    bad, dangling, on_deleted, gaps, used, artifacts, counts = [], [], [], [], set(), [], {}
    if damage := reg.db.damage():  # the rows cannot be trusted: none is read
        lists = ("bad_artifacts", "dangling_aliases", "aliases_on_deleted", "deleted_files_gone", "version_gaps",
                 "orphan_artifacts", "missing_reports")
        return {"ok": False, "database": damage, **{k: [] for k in lists}, "tmp_files": len(reg.store.tmp_files()),
                "n_versions": None, "n_steer_versions": None, "n_collected": None, "n_deleted": None}
    with reg.db.tx() as t:
        for key, k in ((key, e.kind) for key, e in reg.entities.items()):
            rows = t.q(f"SELECT name, version, artifact_path, artifact_sha256, deleted, collected_at FROM {k.table}")
            artifacts += rows
            counts[key] = len(rows)
            dangling += [f"{a['name']}@{a['alias']}" for a in t.q(
                f"SELECT a.name, a.alias FROM {k.aliases} a LEFT JOIN {k.table} v "
                "ON v.name = a.name AND v.version = a.version WHERE v.version IS NULL")]
            on_deleted += [f"{a['name']}@{a['alias']} -> {a['version']}" for a in t.q(
                f"SELECT a.name, a.alias, a.version FROM {k.aliases} a JOIN {k.table} v "
                "ON v.name = a.name AND v.version = a.version WHERE v.deleted = 1 ORDER BY a.name, a.alias")]
            # numbers 1..last, each once; one statement: PostgreSQL (READ COMMITTED) reads each statement at its
            # own snapshot, so a name's last_version read apart from its versions could miss (or see) a version
            # another replica committed in between, and report a gap in a healthy registry
            for r in t.q(f"SELECT n.name, n.last_version, COUNT(DISTINCT v.version) AS n, MIN(v.version) AS lo, "
                         f"MAX(v.version) AS hi FROM {k.names} n LEFT JOIN {k.table} v ON v.name = n.name "
                         f"GROUP BY n.name, n.last_version"):
                last = int(r["last_version"])
                if (int(r["n"] or 0), r["lo"], r["hi"]) != (last, 1 if last else None, last if last else None):
                    gaps.append(r["name"])
        reports = t.q("SELECT name, version, report_path FROM versions WHERE report_path IS NOT NULL AND deleted = 0 "
                      "AND collected_at IS NULL ORDER BY name, version")
    collected = [r for r in artifacts if r["collected_at"] is not None]
    gone = []
    for r in artifacts:
        if r["collected_at"] is not None:  # `registry gc` removed its files (unless shared: checked with the sharer)
            continue
        used.add(r["artifact_path"])
        if r["deleted"] and _gone(reg.store, r["artifact_path"]):  # nothing reads it; gc says so
            gone.append(f"{r['name']}:{r['version']}: {GONE}")
            continue
        try:
            with reg.store.opened(r["artifact_path"], r["artifact_sha256"]):  # hashed in chunks, nothing read
                pass
        except IntegrityError as exc:
            bad.append(f"{r['name']}:{r['version']}: {exc}")
    tmp = len(reg.store.tmp_files())
    if sweep:
        reg.store.sweep_tmp()
    orphans = sorted(reg.store.all_relpaths() - used)
    missing = [f"{r['name']}:{r['version']}: its fit report is missing (GET .../report answers 404)" for r in reports
               if not reg.report_path_of(r["report_path"]).is_file()]
    return {"ok": not bad and not dangling and not gaps, "database": [], "bad_artifacts": bad,
            "dangling_aliases": dangling, "aliases_on_deleted": on_deleted, "deleted_files_gone": gone,
            "version_gaps": gaps, "orphan_artifacts": orphans, "tmp_files": tmp, "n_versions": counts["maps"],
            "n_steer_versions": counts.get("steers", 0), "n_collected": len(collected),
            "n_deleted": sum(1 for r in artifacts if r["deleted"] and r["collected_at"] is None),
            "missing_reports": missing}


def _gone(store, rel: str) -> bool:
    """Whether artifact ``rel`` is not there at all (unreadable, or outside the folder: :meth:`opened` says which)."""
    try:
        store.path(rel).stat()
    except FileNotFoundError:
        return True
    except (OSError, IntegrityError):
        return False
    return False
