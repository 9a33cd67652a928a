"""Portable registry bundles: ``manifest.json`` + artifacts (+ reports), as a ``.zip`` or a folder.

A bundle holds maps (every version, aliases, tags, reports) and steers (every version, aliases),
and the spaces they use. Importing keeps version numbers. A version that already exists with the
same artifact sha256 is skipped (importing twice is a no-op); with a different artifact it is a
ConflictError, or, with ``on_conflict="renumber"``, it is added as a new version (once: a version
with the same artifact and creation time is skipped, so a renumbering import repeated is a no-op too); a record
that names a renumbered version (a transferred steer's ``params`` / ``inputs`` ``map`` and ``steer``) names its new
number; one naming a version outside the bundle names the version here with the artifact it named
(:mod:`.bundle_refs`). A version deleted here stays deleted (listed as ``deleted_here``, not skipped, when the bundle
has it live).
Existing aliases are never moved (one the bundle points elsewhere is listed as ``aliases_kept``: a replica synced
by import kept serving its old version, said nowhere), nor existing spaces changed (their encoder, prefixes and
description: only a field the space here leaves empty is filled in). A NaN or infinite number in a record's JSON
fields (a metric that came out undefined) is exported as ``null``, as the HTTP API shows it: a manifest holds JSON
only.

A version whose files ``registry gc`` collected (``collected_at``: deleted, its artifact and report removed) travels
as its record alone, without ``bundle_artifact`` or ``bundle_report``: the import inserts it deleted and collected,
with no file, so every read of it there says so as it does here, and the versions still number 1..N. Any other
version without its artifact is refused. (A release before this one refuses such a bundle: IntegrityError.)

Import is strict and all-or-nothing. A bundle comes from elsewhere, so it is checked as if it
had come over HTTP, in three phases:

1. **manifest**: names and aliases follow :mod:`.names`; dims in ``1..MAX_DIM``; version numbers
   in ``1..MAX_VERSION``, each name's running 1..N without gaps; at most ``MAX_ENTRIES`` versions; texts and
   JSON fields bounded, the JSON held to an HTTP body's rules (finite numbers, integers within 64 bits, nesting);
   aliases point at versions the bundle holds;
2. **files**: every entry is read with a byte bound derived from its dims (so a small zip cannot
   expand into gigabytes), from inside the bundle only (a folder entry that is a symbolic link,
   or resolves outside the folder, is refused), its sha256 checked, and the artifact **parsed**
   (``LinearMap`` / ``ClusterMap`` / ``Steer`` / ``MeanShift``) and its dims (for a map also its
   ``map_kind`` and ``n_clusters``) compared with the manifest;
3. **write**: artifacts go to the content-addressed store, then one database transaction inserts
   every space, version, tag and alias. Any failure before the commit leaves the registry as it
   was (IntegrityError / InvalidNameError / ConflictError naming the entry).
"""

from __future__ import annotations

import json
import uuid
import zipfile
from collections import Counter
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path

from align.exceptions import InputError

from ..io import json_finite
from ..limits import MAX_JSON_DEPTH, check_json_depth
from ..storage import atomic_write, folder_aside
from .elsewhere import refuse_elsewhere
from .entity import KINDS, VERSION_TABLES, artifacts_in_use, now, package_version
from .errors import ConflictError, IntegrityError, InvalidNameError, NotFoundError
from .bundle_refs import ref_sha256, relink
from .names import MAX_TAGS, check_alias, check_name, check_tags, fs_safe
from .store import sha256_bytes

__all__ = ["export_bundle", "import_bundle", "BUNDLE_FORMAT", "MAX_DIM", "MAX_VERSION", "MAX_ENTRIES"]

BUNDLE_FORMAT = "vecbridge.registry-bundle"
MAX_DIM = 65536                      # largest space dimension accepted from a bundle
MAX_VERSION = 1_000_000              # largest version number accepted from a bundle
MAX_ENTRIES = 10_000                 # versions (maps + steers) in one bundle
MAX_CLUSTERS = 4096                  # clusters of one cluster map (bounds its artifact's size with the dims)
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_REPORT_BYTES = 32 * 1024 * 1024
MAX_TEXT = 64 * 1024                 # description, method, package version, created_at, each JSON field
_SLACK = 1024 * 1024                 # header / metadata room in an artifact beyond its arrays


class _Writer:
    """Entries into a zip file (``as_zip``) or a folder (each file written atomically)."""

    def __init__(self, path: Path, as_zip: bool):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) if as_zip else None
        self.root = path
        if self.zip is None:
            path.mkdir(parents=True, exist_ok=True)

    def write(self, rel: str, data: bytes):
        if self.zip is not None:
            self.zip.writestr(rel, data)
        else:
            atomic_write(self.root / rel, data)

    def close(self):
        if self.zip is not None:
            self.zip.close()


def _zip_start(path: Path) -> bool:  # begins as a zip does (a local file header): a truncated copy of one still does
    with suppress(OSError), open(path, "rb") as fh:
        return fh.read(4) == b"PK\x03\x04"
    return False


class _Reader:
    """Bounded reads of bundle entries from a zip or a folder (no links, nothing outside the bundle)."""

    def __init__(self, path: Path):
        if not path.exists() and not path.is_symlink():
            raise NotFoundError(f"bundle {path} does not exist")
        if path.is_symlink():
            raise IntegrityError(f"bundle {path} is a symbolic link; give the bundle itself")
        try:
            self.zip = zipfile.ZipFile(path) if path.is_file() else None
        except (zipfile.BadZipFile, OSError):
            raise IntegrityError(f"{path.name} is a damaged or truncated zip (its directory, at the end, is unreadable"
                                 f"): an incomplete copy? copy the bundle again" if _zip_start(path)
                                 else f"{path.name} is neither a zip bundle nor a bundle folder") from None
        if self.zip is not None:  # two entries of one name: which one is read is the zip library's choice
            names = Counter(self.zip.namelist())
            twice = sorted(n for n, c in names.items() if c > 1)
            if twice:
                self.zip.close()
                raise IntegrityError(f"{path.name} holds entries named twice ({', '.join(twice[:3])[:200]}): "
                                     "not a bundle an export writes")
        if self.zip is None and not path.is_dir():
            raise IntegrityError(f"{path} is neither a zip bundle nor a bundle folder")
        self.root = path.resolve()

    def read(self, rel, limit: int) -> bytes:
        """The bytes of entry ``rel``; IntegrityError when missing, a link, or larger than ``limit``."""
        if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel or rel.startswith("/") \
                or any(part in ("", ".", "..") for part in rel.split("/")):
            raise InvalidNameError(f"bundle entry {str(rel)[:80]!r} leaves the bundle or is not a plain path")
        try:
            if self.zip is not None:
                info = self.zip.getinfo(rel)
                if info.file_size > limit:
                    raise IntegrityError(f"bundle entry {rel} expands to {info.file_size} bytes (at most {limit})")
                with self.zip.open(info) as fh:
                    data = fh.read(limit + 1)
            else:
                p = self.root
                for part in rel.split("/"):
                    p = p / part
                    if p.is_symlink():
                        raise IntegrityError(f"bundle entry {rel} is (or passes through) a symbolic link")
                if not p.is_file():
                    raise IntegrityError(f"bundle is missing {rel} (or it is not a regular file)")
                with open(p, "rb") as fh:
                    data = fh.read(limit + 1)
        except (KeyError, FileNotFoundError):
            raise IntegrityError(f"bundle is missing {rel}") from None
        except (OSError, zipfile.BadZipFile, EOFError, RuntimeError) as exc:  # zlib errors, encrypted entries
            raise IntegrityError(f"bundle entry {rel} cannot be read: {exc}") from None
        if len(data) > limit:
            raise IntegrityError(f"bundle entry {rel} is larger than {limit} bytes")
        return data

    def close(self):
        if self.zip is not None:
            self.zip.close()


def export_bundle(reg, path: Path, names: list[str] | None = None) -> Path:
    """Write every map and steer (or only the maps and steers ``names``) with all versions, aliases, tags,
    spaces and artifacts (a collected version: its record, without the files gc removed). A ``.zip`` or a folder
    appears whole or not at all (written aside, then renamed); a folder must be new or empty (an export used to
    merge into whatever was there, the data dir included)."""
    picked = None if names is None else sorted(set(names))  # each name's summaries, not every map's and steer's
    chosen = {"maps": reg.list_maps() if picked is None else [m for n in picked for m in reg.list_maps(name=n)],
              "steers": reg.list_steers() if picked is None else [s for n in picked for s in reg.list_steers(name=n)]}
    if picked is not None:
        missing = set(picked) - {m["name"] for m in chosen["maps"]} - {s["name"] for s in chosen["steers"]}
        if missing:
            raise NotFoundError(f"no map or steer named {', '.join(map(repr, sorted(missing)))}")
    as_zip = path.suffix.lower() == ".zip"  # (bundle.ZIP was written as a folder of that name)
    if as_zip and path.exists():  # replaced silently, where a folder export refuses a non-empty folder
        raise ConflictError(f"{path} exists: export into a new file (or remove it first)")
    if not as_zip and path.exists() and (not path.is_dir() or any(path.iterdir())):  # it merged into what was there
        raise ConflictError(f"{path} exists and is not an empty folder: export into a new folder (or a .zip)")
    # the artifact folder's writer lock (shared), to the last file copied: `registry gc` waits, so a version listed
    # as not collected keeps its files (a gc in between removed them and the export failed, "missing or unreadable")
    with reg.store.pinned():
        if as_zip:
            atomic_write(path, lambda tmp: _export(reg, _Writer(tmp, True), chosen, names), held=True)
        else:
            with folder_aside(path) as (tmp, _):  # a folder too appears whole or not at all
                _export(reg, _Writer(tmp, False), chosen, names)
    return path


def _export(reg, w: _Writer, chosen: dict, names: list[str] | None) -> None:
    try:
        manifest = {"format": BUNDLE_FORMAT, "format_version": 1, "package_version": package_version(),
                    "exported_at": datetime.now(timezone.utc).isoformat(), "spaces": [], "maps": [], "steers": []}
        used_spaces = {m[c] for m in chosen["maps"] for c in ("source_space", "target_space")}
        used_spaces |= {s["space"] for s in chosen["steers"]}
        written = set()  # artifacts are content-addressed: versions with the same bytes share one entry
        manifest["spaces"] = [s.to_dict() for s in reg.list_spaces() if names is None or s.name in used_spaces]
        for key, summaries in chosen.items():
            for summary in summaries:
                versions = []
                for v in reg.entities[key].list(summary["name"]):
                    d = v.to_dict()
                    if refs := ref_sha256(reg.entities, d):  # the artifacts its lineage names (bundle_refs)
                        d["ref_sha256"] = refs
                    if v.collected_at:  # `registry gc` removed its files: the record travels alone, for lineage
                        versions.append(d)
                        continue
                    d["bundle_artifact"] = f"artifacts/{v.artifact_path}"
                    if d["bundle_artifact"] not in written:
                        written.add(d["bundle_artifact"])
                        w.write(d["bundle_artifact"], reg.store.get(v.artifact_path, v.artifact_sha256))
                    rp = reg.report_file(v) if getattr(v, "report_path", None) else None
                    if rp is not None and rp.exists():
                        d["bundle_report"] = f"reports/{fs_safe(v.name)}/v{v.version}-{rp.name}"
                        w.write(d["bundle_report"], rp.read_bytes())
                    versions.append(d)
                manifest[key].append({**summary, "versions": versions})
        w.write("manifest.json", json.dumps(json_finite(manifest), indent=1, sort_keys=True, allow_nan=False).encode())
    finally:
        w.close()


# --- validation of a manifest (phase 1) ---------------------------------------------------------

def _int(v, what: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise IntegrityError(f"bundle: {what} must be an integer in {lo}..{hi}, got {str(v)[:40]!r}")
    return v


def _text(v, what: str, *, optional: bool = False, limit: int = MAX_TEXT) -> str | None:
    if v is None and optional:
        return None
    if not isinstance(v, str) or len(v) > limit or "\x00" in v:
        raise IntegrityError(f"bundle: {what} must be a string of at most {limit} characters without NUL")
    return v


def _jsonish(v, what: str, kind=dict):
    """``v``, free JSON of a record (params, metrics, inputs, data_hashes, a steer's lens), held to what HTTP takes in a
    body: finite numbers, integers within 64 bits, nesting of at most ``MAX_JSON_DEPTH - 1`` levels (the body is
    one). A metric of 10**400 imported, then every listing and search that judged it failed (OverflowError), and
    params of 2**70 or nested 500 deep made the version's every read fail (orjson refuses them; RecursionError)."""
    if not isinstance(v, kind):
        raise IntegrityError(f"bundle: {what} must be a JSON {kind.__name__}")
    try:
        check_json_depth(v, MAX_JSON_DEPTH - 1, what)
    except InputError as exc:
        raise IntegrityError(f"bundle: {exc} (HTTP refuses it too)") from None
    try:
        blob = json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        raise IntegrityError(f"bundle: {what} holds values JSON cannot represent (NaN, Inf)") from None
    if len(blob) > 16 * MAX_TEXT:
        raise IntegrityError(f"bundle: {what} is larger than {16 * MAX_TEXT} bytes")
    return v


def _lens(lens: list, what: str) -> list:
    """A steer's stored lens, as :meth:`align.Steer.lens` writes it: directions (objects with an integer
    ``direction`` and a number ``sigma``) whose ``positive`` / ``negative`` ends are lists of items (objects with an
    integer ``index``, a number ``score`` and optionally a string ``text``). Anything else imported fine and made
    every ``GET /v1/steers/{ref}/lens`` (and ``steer lens``: an internal error on a direction without ``direction``,
    ``sigma`` or an item without ``index``) of it fail."""
    def num(v, integer=False):
        return not isinstance(v, bool) and isinstance(v, int if integer else (int, float))

    for d in lens:
        if not isinstance(d, dict) or not num(d.get("direction"), True) or not num(d.get("sigma")) or not all(
                isinstance(d.get(end, []), list) and all(
                    isinstance(it, dict) and num(it.get("index"), True) and num(it.get("score"))
                    and isinstance(it.get("text", ""), str) for it in d.get(end, []))
                for end in ("positive", "negative")):
            raise IntegrityError(f"bundle: {what} must be a list of directions (objects with an integer 'direction' "
                                 f"and a number 'sigma') whose 'positive' and 'negative' are lists of items (objects "
                                 f"with an integer 'index', a number 'score' and optionally a string 'text')")
    return lens


def _sha(v, what: str) -> str:
    if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise IntegrityError(f"bundle: {what} must be a lowercase hex sha256")
    return v


def _name(v, what: str) -> str:
    try:
        return check_name(v, what)
    except InvalidNameError as exc:
        raise InvalidNameError(f"bundle: {exc}") from None


def _common(d: dict, what: str) -> dict:
    """Fields shared by map and steer versions, checked and normalised."""
    if not isinstance(d, dict):
        raise IntegrityError(f"bundle: {what} must be an object")
    rs = d.get("random_state")
    version = _int(d.get("version"), f"{what} version", 1, MAX_VERSION)
    what = f"{what} version {version}"
    return dict(
        version=version,
        method=_text(d.get("method", ""), f"{what} method", limit=128),
        params=_jsonish(d.get("params", {}), f"{what} params"),
        random_state=None if rs is None else _int(rs, f"{what} random_state", -(2**63), 2**63 - 1),
        data_hashes=_jsonish(d.get("data_hashes", {}), f"{what} data_hashes"),
        package_version=_text(d.get("package_version", ""), f"{what} package_version", limit=128),
        created_at=_text(d.get("created_at", "") or now(), f"{what} created_at", limit=64),
        metrics=_jsonish(d.get("metrics", {}), f"{what} metrics"),
        artifact_sha256=_sha(d.get("artifact_sha256"), f"{what} artifact_sha256"),
        deleted=_flag(d.get("deleted", False), f"{what} deleted"),
        description=_text(d.get("description", "") or "", f"{what} description"),
        inputs=_jsonish(d.get("inputs", {}) or {}, f"{what} inputs"),
        bundle_artifact=_text(d.get("bundle_artifact"), f"{what} bundle_artifact", optional=True, limit=1024),
        ext=_ext(d.get("artifact_path", ""), what),
        collected_at=_collected(d, what),
        ref_sha256={k: _sha(s, f"{what} ref_sha256") for k, s in _jsonish(d.get("ref_sha256", {}) or {},
                                                                         f"{what} ref_sha256").items()},
    )


def _collected(d: dict, what: str) -> str | None:
    """``collected_at`` of a bundle version: None, or the time ``registry gc`` removed the files of this deleted
    version, which then travels without them. Any other version must name its artifact entry."""
    at = _text(d.get("collected_at"), f"{what} collected_at", optional=True, limit=64)
    if at is None:
        if d.get("bundle_artifact") is None:
            raise IntegrityError(f"bundle: {what} has no bundle_artifact: only a version deleted and collected by "
                                 "`registry gc` (collected_at) travels without its artifact")
        return None
    try:
        datetime.fromisoformat(at)
    except ValueError:
        raise IntegrityError(f"bundle: {what} collected_at must be an ISO 8601 time, got {at[:40]!r}") from None
    if d.get("deleted") is not True:  # a live version whose artifact is not in the bundle
        raise IntegrityError(f"bundle: {what} has collected_at but is not deleted: only a deleted version's files "
                             "are collected")
    return at


def _flag(v, what: str) -> bool:
    if not isinstance(v, bool):  # bool("false") is True: a string would delete the version it describes
        raise IntegrityError(f"bundle: {what} must be true or false, got {str(v)[:40]!r}")
    return v


def _ext(rel, what: str) -> str:
    ext = str(rel).rsplit(".", 1)[-1] if isinstance(rel, str) and "." in rel else ""
    if ext not in ("npz", "safetensors"):
        raise IntegrityError(f"bundle: {what} artifact_path must end in .npz or .safetensors")
    return ext


def _aliases(a, versions: set[int], what: str) -> dict[str, int]:
    if not isinstance(a, dict):
        raise IntegrityError(f"bundle: aliases of {what} must be an object")
    out = {}
    for alias, v in a.items():
        try:
            check_alias(alias)
        except InvalidNameError as exc:
            raise InvalidNameError(f"bundle: {what}: {exc}") from None
        out[alias] = _int(v, f"alias {alias!r} of {what}", 1, MAX_VERSION)
        if out[alias] not in versions:
            raise IntegrityError(f"bundle: alias {alias!r} of {what} points at version {v}, which the bundle lacks")
    return out


def _check_manifest(manifest) -> dict:
    """Validated, normalised plan: ``{"spaces": {...}, "maps": [...], "steers": [...]}`` (no I/O)."""
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise IntegrityError("not a vecbridge registry bundle")
    fv = manifest.get("format_version", 1)
    if fv != 1:  # a newer release's bundle said only "not supported": not which release wrote it, nor what to do
        by = str(manifest.get("package_version", "?"))[:40]
        newer = isinstance(fv, int) and not isinstance(fv, bool) and fv > 1
        raise IntegrityError(f"bundle format_version {str(fv)[:20]} is newer than vecbridge {package_version()} reads "
                             f"(1): it was written by vecbridge {by}; import it with that release or a later one"
                             if newer else f"bundle format_version {str(fv)[:20]!r} is not one vecbridge writes (1)")
    spaces: dict[str, dict] = {}
    raw_spaces = manifest.get("spaces", [])
    if not isinstance(raw_spaces, list) or len(raw_spaces) > MAX_ENTRIES:
        raise IntegrityError(f"bundle: spaces must be a list of at most {MAX_ENTRIES}")
    for s in raw_spaces:
        if not isinstance(s, dict):
            raise IntegrityError("bundle: each space must be an object")
        name = _name(s.get("name"), "space name")
        spaces[name] = dict(name=name, dim=_int(s.get("dim"), f"dim of space {name!r}", 1, MAX_DIM),
                            encoder=_text(s.get("encoder"), f"encoder of space {name!r}", optional=True, limit=256),
                            created_at=_text(s.get("created_at") or now(), f"created_at of space {name!r}", limit=64),
                            **{k: _text(s.get(k, "") or "", f"{k} of space {name!r}")
                               for k in ("query_prefix", "passage_prefix", "description")})

    def space(name, dim, what):
        name = _name(name, what)
        dim = _int(dim, f"dim of {what} {name!r}", 1, MAX_DIM)
        have = spaces.setdefault(name, dict(name=name, dim=dim, encoder=None, query_prefix="", passage_prefix="",
                                            description=""))
        if have["dim"] != dim:
            raise IntegrityError(f"bundle: space {name!r} is {have['dim']}-d but a version says {dim}-d")
        return name

    n_entries = 0
    maps = []
    for kind in ("maps", "steers"):
        items = manifest.get(kind, [])
        if not isinstance(items, list):
            raise IntegrityError(f"bundle: {kind} must be a list")
        for m in items:
            if not isinstance(m, dict) or not isinstance(m.get("versions"), list):
                raise IntegrityError(f"bundle: each entry of {kind} must be an object with a versions list")
            name = _name(m.get("name"), "map name" if kind == "maps" else "steer name")
            n_entries += len(m["versions"])
            if n_entries > MAX_ENTRIES:
                raise IntegrityError(f"bundle holds more than {MAX_ENTRIES} versions")
            versions, seen = [], set()
            for d in m["versions"]:
                what = f"{kind[:-1]} {name!r}"
                v = _common(d, what)
                if v["version"] in seen:
                    raise IntegrityError(f"bundle: {what} lists version {v['version']} twice")
                seen.add(v["version"])
                if d.get("name", name) != name:
                    raise IntegrityError(f"bundle: a version of {what} is named {str(d.get('name'))[:40]!r}")
                if kind == "maps":
                    v["source_dim"] = _int(d.get("source_dim"), f"{what} source_dim", 1, MAX_DIM)
                    v["target_dim"] = _int(d.get("target_dim"), f"{what} target_dim", 1, MAX_DIM)
                    v["source_space"] = space(d.get("source_space"), v["source_dim"], "source space")
                    v["target_space"] = space(d.get("target_space"), v["target_dim"], "target space")
                    v["artifact_format"] = v["ext"]
                    tags = d.get("tags", {}) or {}
                    if not isinstance(tags, dict) or len(tags) > MAX_TAGS:  # what a registry may hold, no less
                        raise IntegrityError(f"bundle: tags of {what} must be an object of at most {MAX_TAGS} entries")
                    try:
                        v["tags"] = check_tags(tags, what)
                    except InvalidNameError as exc:
                        raise InvalidNameError(f"bundle: {what}: {exc}") from None
                    v["bundle_report"] = _text(d.get("bundle_report"), f"{what} bundle_report", optional=True,
                                               limit=1024)
                    v["map_kind"] = d.get("map_kind", "linear")
                    if v["map_kind"] not in ("linear", "cluster"):
                        raise IntegrityError(f"bundle: {what} map_kind must be 'linear' or 'cluster', "
                                             f"got {str(v['map_kind'])[:40]!r}")
                    v["n_clusters"] = _int(d.get("n_clusters", 0), f"{what} n_clusters",
                                           *((1, MAX_CLUSTERS) if v["map_kind"] == "cluster" else (0, 0)))
                    v["limit"] = 8 * max(1, v["n_clusters"]) * (v["source_dim"] * v["target_dim"]
                                                                + 3 * (v["source_dim"] + v["target_dim"])) + _SLACK
                else:
                    v["dim"] = _int(d.get("dim"), f"{what} dim", 1, MAX_DIM)
                    v["rank"] = _int(d.get("rank"), f"{what} rank", 0, v["dim"])
                    v["space"] = space(d.get("space"), v["dim"], "steer space")
                    lw = f"{what} version {v['version']} lens"
                    v["lens"] = _lens(_jsonish(d.get("lens", []) or [], lw, list), lw)
                    v["limit"] = 8 * v["dim"] * (2 * v["rank"] + 1) + _SLACK
                versions.append(v)
            if seen and seen != set(range(1, max(seen) + 1)):  # as every registry numbers them (verify checks it)
                missing = sorted(set(range(1, max(seen) + 1)) - seen)
                raise IntegrityError(f"bundle: {kind[:-1]} {name!r} lacks version(s) {missing[:5]}: its versions "
                                     f"must run 1..{max(seen)} without gaps, as an export writes them")
            pairs = {(v.get("source_space"), v.get("target_space"), v.get("space")) for v in versions}
            if len(pairs) > 1:
                raise IntegrityError(f"bundle: the versions of {kind[:-1]} {name!r} disagree on their spaces")
            maps.append(dict(kind=kind, name=name, versions=versions,
                             created_at=_text(m.get("created_at") or now(), f"created_at of {name!r}", limit=64),
                             aliases=_aliases(m.get("aliases", {}) or {}, seen, f"{kind[:-1]} {name!r}")))
    return {"spaces": spaces, "entries": maps}


# --- files (phase 2) ------------------------------------------------------------------------------

def _read_entries(r: _Reader, plan: dict) -> None:
    """Read, hash and parse every artifact (and read every report); adds ``data`` / ``report`` to each version."""
    from align.exceptions import VecbridgeError

    for e in plan["entries"]:
        kind = KINDS[e["kind"]]
        for v in e["versions"]:
            if v["collected_at"] is not None:  # its files are gone: the record alone (an entry it names is not read)
                v["data"] = v["report"] = None
                continue
            where = f"{kind.noun} {e['name']}:{v['version']}"
            data = r.read(v["bundle_artifact"], v["limit"])
            if sha256_bytes(data) != v["artifact_sha256"]:
                raise IntegrityError(f"bundle artifact of {where} does not match its sha256")
            want = tuple(v[f] for f in kind.dims)
            try:
                dims = tuple(getattr(kind.parse(data, v.get("rank", 0)), f, 0) for f in kind.dims)
            except (VecbridgeError, ValueError, KeyError, TypeError, OSError) as exc:
                raise IntegrityError(f"bundle artifact of {where} cannot be read: {str(exc)[:200]}") from None
            if dims != want:
                raise IntegrityError(f"bundle artifact of {where} has dims {dims}, the manifest says {want}")
            # the format the bytes are in, not the one the manifest's file name claims (a .npz name on safetensors
            # bytes was stored as .npz and shown as artifact_format npz)
            v["ext"] = "npz" if data[:2] == b"PK" else "safetensors"
            if "artifact_format" in v:
                v["artifact_format"] = v["ext"]
            v["data"] = data
            v["report"] = r.read(v["bundle_report"], MAX_REPORT_BYTES) if v.get("bundle_report") else None


# --- import (phase 3) -----------------------------------------------------------------------------

def import_bundle(reg, path: Path, *, on_conflict: str = "error") -> dict:
    """Load a bundle into ``reg``, all or nothing: a failed import leaves no row, and removes the artifacts and
    reports it wrote (not those that were there already, nor one another writer is committing meanwhile).

    Returns counts ``{"imported", "skipped", "renumbered", "aliases"}`` over map versions, plus
    ``"steers"`` (steer versions imported or renumbered) and ``"steer_aliases"`` when the bundle holds steers, and
    ``"deleted_here"`` (``["map NAME:N", "steer NAME:N"]``) when versions live in the bundle are present here deleted
    (not restored: an import never undeletes; nor counted as skipped), ``"aliases_kept"`` (``["map NAME@ALIAS -> N
    here, M in the bundle"]``, M numbered here): aliases here, never moved, unlike the bundle's, or not set, on a
    version ``deleted_here``, as ``set_alias`` refuses, and ``"lineage_elsewhere"`` (:mod:`.bundle_refs`). The
    artifacts it stored that no row names then (such versions' files, when gc had collected them) are removed again.
    """
    if on_conflict not in ("error", "renumber"):
        raise InvalidNameError("on_conflict must be 'error' or 'renumber'")
    r = _Reader(Path(path))
    try:
        raw = r.read("manifest.json", MAX_MANIFEST_BYTES)
        try:
            manifest = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, an int of 5,000 digits
            raise IntegrityError(f"bundle manifest is not JSON: {str(exc)[:200]}") from None
        plan = _check_manifest(manifest)
        _read_entries(r, plan)
    finally:
        r.close()

    # reports: written in the transaction, for the versions it inserts only, under names of this import alone
    # (content-addressed names were shared: a failed import removed a report a concurrent one had committed, and
    # skipped versions left reports no row named); a retried transaction's earlier files are removed after it
    reports = {"token": uuid.uuid4().hex[:8], "now": [], "before": []}
    stored: list[str] = []  # artifacts this import wrote (not those already there): removed again if it fails

    def apply(t):
        reports["before"] += reports["now"]
        reports["now"] = []
        return _apply_plan(reg, t, plan, on_conflict, reports)

    refuse_elsewhere(reg.db, reg.store, VERSION_TABLES, "the bundle was not imported")  # as a registration
    try:
        with reg.store.pinned():  # artifacts first, held to the commit (see ArtifactStore.discard)
            for e in plan["entries"]:
                for v in e["versions"]:
                    if (data := v.pop("data")) is None:  # collected: its row names the file its bytes would have
                        v["sha"], v["rel"] = v["artifact_sha256"], reg.store.relpath_for(v["artifact_sha256"], v["ext"])
                        continue
                    v["sha"], v["rel"], _ = reg.store.put_new(data, v["ext"], written=stored)
            counts = reg._write(apply)
        # (below, once the shared hold is given back) the artifacts it stored that no row names: those of versions
        # deleted and collected here, which it does not restore, were orphans no `registry gc` removed
    except BaseException:
        for p in reports["before"] + reports["now"]:
            p.unlink(missing_ok=True)
        with suppress(Exception):  # best effort (the database may be what failed): never hides the import's error
            reg.store.discard(stored, lambda: artifacts_in_use(reg.db))
        raise
    for p in set(reports["before"]) - set(reports["now"]):
        p.unlink(missing_ok=True)
    with suppress(Exception):  # as after a failure: only while no writer holds the folder, never a file a row names
        reg.store.discard(stored, lambda: artifacts_in_use(reg.db))
    return counts


def _apply_plan(reg, t, plan: dict, on_conflict: str, reports: dict) -> dict:
    """Every database write of an import, in the caller's one transaction; the report of each version inserted is
    written first (its path appended to ``reports["now"]``)."""
    counts = {"imported": 0, "skipped": 0, "renumbered": 0, "aliases": 0}
    n_steers = n_steer_aliases = 0
    numbers: dict[tuple[str, str], dict[int, int]] = {}  # (kind, name) -> {bundle version: its number here}
    inserted, gone, kept = [], [], []  # gone: live in the bundle, deleted here (an import never undeletes)
    for s in plan["spaces"].values():
        reg._put_space(t, s, keep=True)  # a space here keeps its encoder, prefixes, description
    for e in plan["entries"]:
        name, is_map, store = e["name"], e["kind"] == "maps", reg.entities[e["kind"]]
        local = numbers.setdefault((e["kind"], name), {})
        made: set[int] = set()  # numbers this import gave: a later bundle version with that number is not there yet
        for v in e["versions"]:
            store.bind(t, name, v, created=e["created_at"], here=" here, the bundle says")  # its export's time
            have = store.sha_of(t, name, v["version"])
            tags = dict(v.get("tags", {}))
            if have == v["artifact_sha256"] and v["version"] not in made:
                # the same version (imported before); a renumbered copy of this one, when the bundle's versions
                # share their artifact, is the row with its creation time
                local[v["version"]] = store.copy_of(t, name, have, v["created_at"]) or v["version"]
                _skip(t, store, name, local[v["version"]], v, counts, gone)
                continue
            if have is not None:
                if on_conflict == "error":
                    raise ConflictError(f"{store.kind.noun} {name}:{v['version']} exists here with another artifact "
                                        "(`vecbridge registry import --renumber`, on_conflict='renumber' in Python, "
                                        "adds it as a new version)")
                copy = store.copy_of(t, name, v["artifact_sha256"], v["created_at"])
                if copy is not None:  # renumbered by an earlier import of this bundle: skipped, not added again
                    local[v["version"]] = copy
                    _skip(t, store, name, copy, v, counts, gone)
                    continue
                number = store.allocate(t, name)
                tags["imported_from"] = f"{name}:{v['version']}"
                status = "renumbered"
            else:
                number = v["version"]
                store.claim(t, name, number)
                status = "imported"
            local[v["version"]] = number
            made.add(number)
            report_rel = None
            if v.get("report") is not None:
                digest = sha256_bytes(v["report"])[:12]
                report_rel = f"{fs_safe(name)}/imported-{number}-{digest}-{reports['token']}.html"
                atomic_write(reg.report_dir / report_rel, v["report"])
                reports["now"].append(reg.report_dir / report_rel)
            store.insert(t, name, number, {**v, "artifact_sha256": v["sha"], "artifact_path": v["rel"],
                                           "report_path": report_rel}, tags if is_map else None)
            inserted.append((store, name, number, v))
            if is_map:
                counts[status] += 1
            else:
                n_steers += 1
        for alias, version in e["aliases"].items():
            if f"{store.kind.noun} {name}:{local[version]}" in gone and not t.one(  # as `registry alias` refuses
                    f"SELECT 1 FROM {store.kind.aliases} WHERE name = ? AND alias = ?", (name, alias)):
                kept.append(f"{store.kind.noun} {name}@{alias} not set: {local[version]} in the bundle, deleted here")
            elif store.put_alias(t, name, alias, local[version], move=False):
                if is_map:
                    counts["aliases"] += 1
                else:
                    n_steer_aliases += 1
            elif (here := t.one(f"SELECT version FROM {store.kind.aliases} WHERE name = ? AND alias = ?",
                                (name, alias))) and here["version"] != local[version]:  # kept, unlike the bundle's
                kept.append(f"{store.kind.noun} {name}@{alias} -> {here['version']} here, "
                            f"{local[version]} in the bundle")
    if n_steers or any(e["kind"] == "steers" for e in plan["entries"]):
        counts["steers"], counts["steer_aliases"] = n_steers, n_steer_aliases
    if elsewhere := relink(t, reg.entities, inserted, numbers):  # lineage naming versions this registry lacks
        counts["lineage_elsewhere"] = elsewhere
    if gone:
        counts["deleted_here"] = gone
    if kept:
        counts["aliases_kept"] = kept
    return counts


def _skip(t, store, name: str, here: int, v: dict, counts: dict, gone: list) -> None:
    """Count bundle version ``v``, found here as ``name:here``: skipped (already here), or, live in the bundle and
    deleted here, listed in ``gone``: such a version (a bundle taken before a delete) counted as skipped read as
    "already here" when nothing was restored."""
    deleted = t.one(f"SELECT deleted FROM {store.kind.table} WHERE name = ? AND version = ?", (name, here))["deleted"]
    if deleted and not v["deleted"]:
        gone.append(f"{store.kind.noun} {name}:{here}")
    elif store.kind.noun == "map":
        counts["skipped"] += 1
