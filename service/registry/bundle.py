"""Portable registry bundles: ``manifest.json`` + artifacts (+ reports), as a ``.zip`` or a folder.

Importing keeps version numbers. A version that already exists with the same artifact sha256 is
skipped (importing twice is a no-op); with a different artifact it is a ConflictError, or, with
``on_conflict="renumber"``, it is added as a new version. Existing aliases are never moved.
"""

from __future__ import annotations

import json
import zipfile
from datetime import datetime, timezone
from pathlib import Path

from .core import _dumps, _now, package_version
from .errors import ConflictError, IntegrityError, InvalidNameError, NotFoundError
from .models import VersionInfo
from .names import check_alias, check_name, fs_safe
from .store import sha256_bytes

__all__ = ["export_bundle", "import_bundle", "BUNDLE_FORMAT"]

BUNDLE_FORMAT = "vecbridge.registry-bundle"


class _Writer:
    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) if path.suffix == ".zip" else None
        self.root = path
        if self.zip is None:
            path.mkdir(parents=True, exist_ok=True)

    def write(self, rel: str, data: bytes):
        if self.zip is not None:
            self.zip.writestr(rel, data)
        else:
            p = self.root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)

    def close(self):
        if self.zip is not None:
            self.zip.close()


class _Reader:
    def __init__(self, path: Path):
        if not path.exists():
            raise NotFoundError(f"bundle {path} does not exist")
        try:
            self.zip = zipfile.ZipFile(path) if path.is_file() else None
        except zipfile.BadZipFile:
            raise IntegrityError(f"{path.name} is neither a zip bundle nor a bundle folder") from None
        self.root = path

    def read(self, rel: str) -> bytes:
        if ".." in rel.split("/") or rel.startswith("/"):
            raise InvalidNameError(f"bundle entry {rel!r} leaves the bundle")
        try:
            if self.zip is not None:
                return self.zip.read(rel)
            return (self.root / rel).read_bytes()
        except (KeyError, OSError):
            raise IntegrityError(f"bundle is missing {rel}") from None

    def close(self):
        if self.zip is not None:
            self.zip.close()


def export_bundle(reg, path: Path, names: list[str] | None = None) -> Path:
    """Write every map (or only ``names``) with all versions, aliases, tags, spaces and artifacts."""
    maps = [m for m in reg.list_maps() if names is None or m["name"] in names]
    if names is not None:
        missing = set(names) - {m["name"] for m in maps}
        if missing:
            raise NotFoundError(f"unknown map(s): {sorted(missing)}")
    w = _Writer(path)
    try:
        manifest = {"format": BUNDLE_FORMAT, "format_version": 1, "package_version": package_version(),
                    "exported_at": datetime.now(timezone.utc).isoformat(), "spaces": [], "maps": []}
        used_spaces = {m["source_space"] for m in maps} | {m["target_space"] for m in maps}
        manifest["spaces"] = [s.to_dict() for s in reg.list_spaces() if names is None or s.name in used_spaces]
        for m in maps:
            versions = []
            for v in reg.list_versions(m["name"]):
                d = v.to_dict()
                d["bundle_artifact"] = f"artifacts/{v.artifact_path}"
                w.write(d["bundle_artifact"], reg.store.get(v.artifact_path, v.artifact_sha256))
                rp = reg.report_file(v)
                if rp is not None and rp.exists():
                    d["bundle_report"] = f"reports/{fs_safe(v.name)}/v{v.version}-{rp.name}"
                    w.write(d["bundle_report"], rp.read_bytes())
                versions.append(d)
            manifest["maps"].append({**m, "versions": versions})
        w.write("manifest.json", json.dumps(manifest, indent=1, sort_keys=True).encode())
    finally:
        w.close()
    return path


def import_bundle(reg, path: Path, *, on_conflict: str = "error") -> dict:
    """Load a bundle into ``reg``; returns counts ``{"imported", "skipped", "renumbered", "aliases"}``."""
    if on_conflict not in ("error", "renumber"):
        raise InvalidNameError("on_conflict must be 'error' or 'renumber'")
    r = _Reader(path)
    try:
        try:
            manifest = json.loads(r.read("manifest.json"))
        except json.JSONDecodeError as exc:
            raise IntegrityError(f"bundle manifest is not JSON: {exc}") from None
        if manifest.get("format") != BUNDLE_FORMAT:
            raise IntegrityError("not a vecbridge registry bundle")
        for s in manifest["spaces"]:
            reg.register_space(s["name"], int(s["dim"]), s.get("encoder"), s.get("query_prefix", ""),
                               s.get("passage_prefix", ""), s.get("description", ""))
        counts = {"imported": 0, "skipped": 0, "renumbered": 0, "aliases": 0}
        for m in manifest["maps"]:
            name = check_name(m["name"], "map name")
            local = {}
            for d in m["versions"]:
                data = r.read(d["bundle_artifact"])
                if sha256_bytes(data) != d["artifact_sha256"]:
                    raise IntegrityError(f"bundle artifact of {name}:{d['version']} does not match its sha256")
                report = r.read(d["bundle_report"]) if d.get("bundle_report") else None
                status, local[int(d["version"])] = _import_version(reg, d, data, report, on_conflict)
                counts[status] += 1
            for alias, version in m.get("aliases", {}).items():
                check_alias(alias)

                def add_alias(t, name=name, alias=alias, version=local.get(int(version), int(version))):
                    reg._get_version(t, name, version)
                    if t.one("SELECT 1 FROM aliases WHERE name = ? AND alias = ?", (name, alias)) is None:
                        t.q("INSERT INTO aliases (name, alias, version) VALUES (?, ?, ?)", (name, alias, version))
                        return 1
                    return 0  # existing aliases are never moved

                counts["aliases"] += reg._write(add_alias)
        return counts
    finally:
        r.close()


def _import_version(reg, d: dict, data: bytes, report: bytes | None, on_conflict: str) -> tuple[str, int]:
    """Import one version; returns (what happened, its version number here)."""
    info = VersionInfo(**{k: v for k, v in d.items() if k in VersionInfo.__dataclass_fields__})
    name, version = info.name, int(info.version)
    try:
        have = reg.get_version(name, version)
    except NotFoundError:
        have = None
    if have is not None:
        if have.artifact_sha256 == info.artifact_sha256:
            return "skipped", version
        if on_conflict == "error":
            raise ConflictError(f"{name}:{version} exists here with another artifact "
                                "(use on_conflict='renumber' to add it as a new version)")
        from align import LinearMap

        report_rel = _store_report(reg, name, None, report) if report is not None else None
        new = reg.register_version(name, LinearMap.from_bytes(data), source_space=info.source_space,
                                   target_space=info.target_space, method=info.method, params=info.params,
                                   random_state=info.random_state, data_hashes=info.data_hashes,
                                   metrics=info.metrics, description=info.description,
                                   tags={**info.tags, "imported_from": f"{name}:{version}"},
                                   inputs=info.inputs, artifact_format=info.artifact_format or None,
                                   report_path=report_rel)
        if info.deleted:
            reg.delete_version(name, new.version)
        return "renumbered", new.version
    ext = info.artifact_path.rsplit(".", 1)[-1]
    sha, rel = reg.store.put(data, ext)
    report_rel = _store_report(reg, name, version, report) if report is not None else None

    def fn(t):
        reg._ensure_space(t, info.source_space, info.source_dim)
        reg._ensure_space(t, info.target_space, info.target_dim)
        t.q("INSERT INTO maps (name, source_space, target_space, source_dim, target_dim, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
            (name, info.source_space, info.target_space, info.source_dim, info.target_dim, _now()))
        row = t.one("SELECT source_space, target_space, last_version FROM maps WHERE name = ?" + reg.db.for_update,
                    (name,))
        if (row[0], row[1]) != (info.source_space, info.target_space):
            raise ConflictError(f"map {name!r} connects {row[0]} -> {row[1]} here, the bundle says "
                                f"{info.source_space} -> {info.target_space}")
        reg._insert_version(t, name, version, dict(
            source_space=info.source_space, target_space=info.target_space, source_dim=info.source_dim,
            target_dim=info.target_dim, method=info.method, params=_dumps(info.params),
            random_state=info.random_state, data_hashes=_dumps(info.data_hashes),
            package_version=info.package_version, created_at=info.created_at, metrics=_dumps(info.metrics),
            artifact_sha256=sha, artifact_path=rel, artifact_format=info.artifact_format, deleted=int(info.deleted),
            description=info.description, report_path=report_rel, inputs=_dumps(info.inputs)))
        t.q("UPDATE maps SET last_version = ? WHERE name = ? AND last_version < ?", (version, name, version))
        for k, v in info.tags.items():
            t.q("INSERT INTO tags (name, version, key, value) VALUES (?, ?, ?, ?)", (name, version, k, str(v)))

    reg._write(fn)
    return "imported", version


def _store_report(reg, name: str, version, data: bytes) -> str:
    rel = f"{fs_safe(name)}/imported-{version or 'new'}-{sha256_bytes(data)[:12]}.html"
    p = reg.report_dir / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return rel
