"""Rolling back: processes of release 58ebe2e work on a data dir (and registry) this release wrote.

Operators upgrade the replicas of one data dir / PostgreSQL registry one at a time, or roll back, so processes of
two releases read and write the same files. Checked by hand with the code of 58ebe2e (the release before session
18's IVF ``train_rows``, background index loading, settings files, backup sweeping, eval sampling), see
RELIABILITY.md "Rolling back to 58ebe2e": on a data dir this release wrote through its HTTP service and CLI,
58ebe2e listed, resolved and loaded every map version, loaded and searched all 8 indexes with the same ids,
scores and payloads, passed ``registry verify``, served it over HTTP, added rows to each index and registered a
version, and this release read all of that back (SQLite and PostgreSQL registries; both servers at once too).

CI has no old code, so these tests check the properties that make it work, against rules copied from 58ebe2e:

- every index generation's ``meta.json`` has ``format_version`` <= 3 and only ``params`` 58ebe2e's
  ``check_index_params`` accepts, in its ranges: it refuses an unknown key, and the index would not load there
  (build-only parameters, IVF's ``train_rows``, are kept under ``build``, which it ignores);
- every registry table has the columns 58ebe2e reads, any further column has a default (its inserts do not name
  it), and rows hold only the ``map_kind`` / ``artifact_format`` values it loads; ``eval --record`` writes only the
  ``eval.*`` tags it ranks by; the job records have its columns.
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path

import numpy as np
from _servers import serve_in_thread
from conftest import run_cli

MAKER = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade_a9b56d8" / "make_fixture.py"

# --- rules of release 58ebe2e (service/limits.py, service/indexes/persist.py, service/registry/db.py, job_store.py)
OLD_FORMAT, OLD_FORMAT_VERSION = "vecbridge.SpaceIndex", 3
OLD_PARAMS = {"flat": {}, "hnsw": {"M": (2, 256), "ef_construction": (1, 4_096), "ef_search": (1, 32_768)},
              "ivf": {"nlist": (1, 65_536), "nprobe": (1, 65_536)}}
OLD_SEED = (0, 2**31 - 1)
OLD_METRICS = ("cosine", "ip")
OLD_TABLES = {
    "vb_meta": ("key", "value"),
    "spaces": ("name", "dim", "encoder", "query_prefix", "passage_prefix", "description", "created_at"),
    "maps": ("name", "source_space", "target_space", "source_dim", "target_dim", "created_at", "last_version"),
    "versions": ("name", "version", "source_space", "target_space", "source_dim", "target_dim", "method", "params",
                 "random_state", "data_hashes", "package_version", "created_at", "metrics", "artifact_sha256",
                 "artifact_path", "artifact_format", "deleted", "description", "report_path", "inputs", "map_kind",
                 "n_clusters"),
    "aliases": ("name", "alias", "version"),
    "tags": ("name", "version", "key", "value"),
    "steer_names": ("name", "space", "dim", "created_at", "last_version"),
    "steers": ("name", "version", "space", "dim", "rank", "method", "params", "random_state", "data_hashes",
               "package_version", "created_at", "metrics", "artifact_sha256", "artifact_path", "deleted",
               "description", "lens", "inputs"),
    "steer_aliases": ("name", "alias", "version"),
}
OLD_JOB_COLUMNS = ("id", "kind", "description", "state", "stage", "fraction", "created_at", "started_at",
                   "finished_at", "stage_seconds", "result", "error", "idempotency_key", "request_hash",
                   "cancel_requested", "owner")
OLD_MAP_KINDS, OLD_ARTIFACT_FORMATS = ("linear", "cluster"), ("npz", "safetensors")
OLD_EVAL_TAGS = {"eval.top1", "eval.mean_rank", "eval.cos", "eval.recall@10", "eval.n_candidates",
                 "eval.labelled_retention"}
#: eval tags written since 58ebe2e: it shows them as plain text tags and ranks paths by eval.top1/n_candidates only
#: (a top-1 that eval.top1_chance_p says may be chance too, as it did before the tag)
NEW_EVAL_TAGS = {"eval.n_queries", "eval.top1_interval", "eval.top1_chance_p"}


def _maker():
    spec = importlib.util.spec_from_file_location("make_fixture", MAKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MK = _maker()


def _rows(n: int = 700) -> tuple[dict[str, np.ndarray], list[str]]:
    """Related rows of the fixture's three spaces (24, 24, 16 columns; no downloads) and texts of varied length."""
    rng = np.random.default_rng(5)
    mini = rng.standard_normal((n, 24)).astype(np.float32)
    e5 = (mini @ np.linalg.qr(rng.standard_normal((24, 24)))[0] + 0.1 * rng.standard_normal((n, 24)))
    glove = e5 @ rng.standard_normal((24, 16)) / 5
    texts = [f"text {i} " + "word " * (i % 23) for i in range(n)]
    return {"mini24": mini, "e524": e5.astype(np.float32), "glove16": glove.astype(np.float32)}, texts


def old_meta_problems(meta: dict) -> list[str]:
    """What 58ebe2e would refuse in an index generation's meta (its ``check_meta`` and format check)."""
    out = []
    if meta.get("format") != OLD_FORMAT or int(meta.get("format_version", 0)) > OLD_FORMAT_VERSION:
        out.append(f"format {meta.get('format')} {meta.get('format_version')}")
    if meta.get("kind") not in OLD_PARAMS or meta.get("metric") not in OLD_METRICS:
        return [*out, f"kind {meta.get('kind')} / metric {meta.get('metric')}"]
    rules = OLD_PARAMS[meta["kind"]]
    for key, value in meta["params"].items():
        lo, hi = OLD_SEED if key == "random_state" else rules.get(key, (None, None))
        if lo is None:
            out.append(f"params.{key}: unknown to 58ebe2e (it refuses the index)")
        elif not (isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi):
            out.append(f"params.{key}={value!r} outside {lo}..{hi}")
    return out


def _index_metas(data: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((data / "indexes").glob("*/meta.json"))}


def _check_columns(have: dict[str, dict[str, bool]], old: dict[str, tuple]) -> list[str]:
    """``have``: table -> {column: needs a value (NOT NULL without a default)}; what 58ebe2e would trip on."""
    out = [f"{t}.{c}: missing" for t, cols in old.items() for c in cols if c not in have.get(t, {})]
    return out + [f"{t}.{c}: new and NOT NULL without a default (58ebe2e's inserts do not name it)"
                  for t, cols in have.items() if t in old for c, needed in cols.items() if c not in old[t] and needed]


def _sqlite_columns(path: Path) -> dict[str, dict[str, bool]]:
    with sqlite3.connect(path) as c:
        tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: {r[1]: bool(r[3]) and r[4] is None and not r[5] for r in c.execute(f"PRAGMA table_info({t})")}
                for t in tables}


def test_a_data_dir_this_release_wrote_holds_only_what_58ebe2e_reads(tmp_path, capsys):
    """Every kind of write a user makes (the upgrade fixture's history, IVF indexes with default and explicit
    ``train_rows`` over HTTP and the CLI, adds, deletes, snapshots, ``eval --record`` sampled and in full, a
    backup), then the properties above on the data dir and on the backup."""
    from service.api import create_app
    from service.client import Client
    from service.config import Settings

    data = tmp_path / "data"
    rows, texts = _rows()
    X = rows["e524"]

    def cli(*args):
        code, out, err = run_cli(capsys, "--data-dir", data, *args)
        assert code == 0, (args, out, err)
        return out

    settings = Settings(data_dir=data, api_keys={MK.KEY: ["read", "write"]}, demo_on_empty=False,
                        log_level="WARNING")
    with serve_in_thread(create_app(settings)) as url, Client(url, api_key=MK.KEY, max_retries=0) as vb:
        MK.populate(vb, rows, texts, cli)
        for name, params in (("ivf-default", {}), ("ivf-train", {"nlist": 4, "nprobe": 2, "train_rows": 100})):
            vb.create_index(name, "e524", X[:400], kind="ivf", params=params, random_state=3)
            vb.add(name, X[400:420])
            vb.delete_ids(name, [1, 2, 3])
    np.save(tmp_path / "e5.npy", X[:500])
    np.save(tmp_path / "mini.npy", rows["mini24"])
    np.save(tmp_path / "e5all.npy", X)
    cli("index", "create", "ivf-cli", tmp_path / "e5.npy", "--space", "e524", "--kind", "ivf", "--param", "nlist=5",
        "--param", "train_rows=300", "--quiet")
    cli("index", "add", "ivf-cli", tmp_path / "e5.npy", "--rows", "0:10", "--quiet")
    cli("index", "compact", "ivf-train")
    for extra in (("--max-queries", "50"), ()):
        cli("eval", "--map", "mini-e5:3", "--source", tmp_path / "mini.npy", "--target", tmp_path / "e5all.npy",
            "--rows", "500:700", "--record", *extra)
    cli("backup", tmp_path / "backup", "--quiet")

    for where in (data, tmp_path / "backup"):
        metas = _index_metas(where)
        assert set(metas) == {*MK.INDEXES, "ivf-default", "ivf-train", "ivf-cli"}
        assert {n: old_meta_problems(m) for n, m in metas.items() if old_meta_problems(m)} == {}, where
        assert metas["ivf-train"]["build"] == {"train_rows": 100} and metas["ivf-cli"]["build"] == {"train_rows": 300}
        assert _check_columns(_sqlite_columns(where / "registry.sqlite"), OLD_TABLES) == []
        assert _check_columns(_sqlite_columns(where / "jobs.sqlite"), {"jobs": OLD_JOB_COLUMNS}) == []
        with sqlite3.connect(where / "registry.sqlite") as c:
            kinds = {r for r, in c.execute("SELECT DISTINCT map_kind FROM versions")}
            formats = {r for r, in c.execute("SELECT DISTINCT artifact_format FROM versions")}
            evals = dict(c.execute("SELECT key, value FROM tags WHERE key LIKE 'eval.%'").fetchall())
        assert kinds <= set(OLD_MAP_KINDS) and formats <= set(OLD_ARTIFACT_FORMATS)
        assert set(evals) <= OLD_EVAL_TAGS | NEW_EVAL_TAGS and {"eval.top1", "eval.n_candidates"} <= set(evals)
        # 58ebe2e ranks by eval.top1 among eval.n_candidates: still every held-out row when the queries are sampled
        assert int(float(evals["eval.n_candidates"])) == 200 and 0 <= float(evals["eval.top1"]) <= 1


def test_the_registry_schema_is_one_58ebe2e_reads_and_writes(tmp_path, pg_url):
    """A PostgreSQL registry this release created: 58ebe2e's columns, and no new one it would have to fill."""
    import psycopg

    from service.registry import open_registry

    open_registry(pg_url, tmp_path / "artifacts")
    with psycopg.connect(pg_url) as c:
        have: dict[str, dict[str, bool]] = {}
        for table, col, nullable, default in c.execute(
                "SELECT table_name, column_name, is_nullable, column_default FROM information_schema.columns "
                "WHERE table_schema = current_schema()"):
            have.setdefault(table, {})[col] = nullable == "NO" and default is None
    assert _check_columns(have, OLD_TABLES) == []


def test_the_rules_catch_what_58ebe2e_refuses():
    """The checks above are not vacuous: a meta with ``train_rows`` in ``params`` (as this release wrote before it
    moved to ``build``, which 58ebe2e refused to load) and a NOT NULL column without a default are caught."""
    meta = {"format": OLD_FORMAT, "format_version": 3, "kind": "ivf", "metric": "cosine",
            "params": {"nlist": 4, "nprobe": 2, "random_state": 0, "train_rows": 100}}
    assert old_meta_problems(meta) == ["params.train_rows: unknown to 58ebe2e (it refuses the index)"]
    assert old_meta_problems({**meta, "format_version": 4, "params": {"nlist": 0}}) == ["format vecbridge.SpaceIndex 4",
                                                                                      "params.nlist=0 outside 1..65536"]
    assert _check_columns({"tags": {"name": 1, "version": 1, "key": 1, "value": 1, "unit": True}},
                          {"tags": OLD_TABLES["tags"]}) == [
        "tags.unit: new and NOT NULL without a default (58ebe2e's inserts do not name it)"]
    assert _check_columns({}, {"tags": ("name",)}) == ["tags.name: missing"]
