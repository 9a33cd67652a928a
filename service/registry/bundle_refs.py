"""The references of a bundle's versions to other versions (a transferred steer's ``map`` and source ``steer``, named
``NAME:N`` in its ``params`` / ``inputs``) and what they name in the registry that imports them.

A number names a version only in its own registry. An import renumbers what it must (:func:`relink`); a reference
to a version the bundle does not hold (``registry export --name formal-e5``: the steer without the map it came
through) kept its number, and named whatever version had that number here: another map, or none. The export
therefore records the artifact sha256 each reference named (``ref_sha256`` of the version, ``{"map a-b:1": sha}``),
and the import points the reference at the version here with that artifact; where there is none, the reference keeps
its text and the record's ``inputs`` gain ``<key>_sha256`` (``map_sha256``), the artifact it named, so it cannot be
read as this registry's ``NAME:N`` (listed as ``lineage_elsewhere``).
"""

from __future__ import annotations

from contextlib import suppress

from .errors import RegistryError
from .models import to_columns

__all__ = ["REF_KEYS", "ref_sha256", "relink"]

#: keys of a record's ``params`` / ``inputs`` that name another version, ``NAME:N``, and the kind of entity they name
REF_KEYS = {"map": "maps", "steer": "steers"}


def _refs(d: dict):
    """``(field, key, name, version)`` of every reference of record dict ``d`` (``version`` -1 where not a number)."""
    for field in ("params", "inputs"):
        for key in REF_KEYS:
            ref = (d.get(field) or {}).get(key)
            if isinstance(ref, str) and ":" in ref:
                name, _, version = ref.rpartition(":")
                yield field, key, name, int(version) if version.isdigit() else -1


def ref_sha256(entities: dict, d: dict) -> dict:
    """For the export of record dict ``d``: ``{"KEY NAME:N": artifact sha256}`` of each version it references that
    this registry holds (deleted or collected ones too: the record stays)."""
    out = {}
    for _field, key, name, version in _refs(d):
        with suppress(RegistryError, ValueError):
            out[f"{key} {name}:{version}"] = entities[REF_KEYS[key]].get(name, version).artifact_sha256
    return out


def relink(t, entities: dict, inserted: list, numbers: dict) -> list[str]:
    """Point the references of the versions an import inserted at the numbers the versions they name have here: a
    renumbered version of the bundle (its ``a-b:2`` became ``a-b:3``, ``a-b:2`` here being another map) was still
    named by its old number, so a transferred steer's lineage named a map it never came through. After every insert:
    a reference may name a version of an entry imported later (a steer transferred from another steer). A reference
    outside the bundle goes to the version here with the artifact it named (``ref_sha256``); where none has it, see
    the module's note. Returns those (``"steer NAME:N: map A:1"``)."""
    elsewhere = []
    for store, name, number, v in inserted:
        new = {f: dict(v[f]) for f in ("params", "inputs")}
        shas = v.get("ref_sha256") or {}
        for field, key, ref_name, ref_version in list(_refs(new)):
            here = numbers.get((REF_KEYS[key], ref_name), {}).get(ref_version)
            sha = shas.get(f"{key} {ref_name}:{ref_version}")
            if here is None and isinstance(sha, str):  # outside the bundle: the version here with its artifact
                table = entities[REF_KEYS[key]].kind.table
                same = t.one(f"SELECT artifact_sha256 FROM {table} WHERE name = ? AND version = ?",
                             (ref_name, ref_version))
                if same is None or same["artifact_sha256"] != sha:
                    r = t.one(f"SELECT MIN(version) AS v FROM {table} WHERE name = ? AND artifact_sha256 = ?",
                              (ref_name, sha))
                    here = None if r is None or r["v"] is None else int(r["v"])
                    if here is None:
                        new["inputs"][f"{key}_sha256"] = sha
                        what = f"{store.kind.noun} {name}:{number}: {key} {ref_name}:{ref_version}"
                        elsewhere += [] if what in elsewhere else [what]
            if here is not None:
                new[field][key] = f"{ref_name}:{here}"
        if new != {f: v[f] for f in new}:
            cols = to_columns(store.kind.record, new)
            t.q(f"UPDATE {store.kind.table} SET {', '.join(f'{c} = ?' for c in cols)} WHERE name = ? AND version = ?",
                (*cols.values(), name, number))
    return elsewhere
