"""``vecbridge index ...``: the FAISS indexes of ``DATA_DIR/indexes`` (what ``vecbridge serve`` searches), offline.

Each command opens the data dir's :class:`~service.indexes.IndexStore` as the service does and calls
the operation its HTTP route calls (:mod:`service.ops.indexes`, :mod:`service.ops.index_files`), so
the CLI and ``/v1/indexes`` answer alike on one data dir. A running server sees every write here at
its next request of the index (the store's cross-process protocol: writers hold the index's
``flock``, readers catch up after one ``stat``).

Examples::

    vecbridge index create docs --space e5 corpus.npy --payloads corpus.jsonl     # kind auto (by rows)
    vecbridge index add docs nightly.parquet
    vecbridge index search docs queries.npy --space minilm -k 10 --out hits.jsonl   # through the map path
    vecbridge index compact --all                                                  # before a downgrade
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import click
import numpy as np

from align.exceptions import InputError

from ..errors import EX_TEMPFAIL, exit_code
from ..indexes import IndexConflictError, IndexStore
from ..indexes.csls import CSLS_WEIGHT
from ..io import check_file, check_not_input, iter_chunks, parse_rows, read_texts
from ..limits import MAX_CSLS_K, MAX_EF_SEARCH, MAX_ID, MAX_JSON_DEPTH, MAX_NPROBE, check_json_depth, seed_of
from ..ops import indexes as index_ops
from ..ops.index_files import (
    CHUNK_ROWS,
    FileRows,
    add_from_file,
    check_same_settings,
    count,
    create_from_file,
)
from ..storage import atomic_write, check_writable
from ._common import (
    ROWS,
    Ctx,
    FiniteRange,
    echo_record,
    emit,
    json_opt,
    option_given,
    parse_kv,
    progress_bar,
    quiet_opt,
    random_state_opt,
    read_ids,
    registry_exists,
    search_on,
    warn,
)

__all__ = ["index"]


def _store(obj: Ctx) -> IndexStore:
    store = IndexStore(obj.settings.data_dir / "indexes", listing="`vecbridge index list`")  # not GET /v1/indexes
    store.sweep_tmp()  # a killed `index add`'s temporary snapshot (175 MB) stayed until that index's next write
    return store


def _resolver(obj: Ctx) -> index_ops.RegistryResolver:
    return index_ops.RegistryResolver(obj.registry, obj.settings.path_alias)


class _LazyReferences:
    """What ``index add`` of vectors asks of the registry: the references of the rows check, the registry opened
    only when they are asked for (a block of at least ``MEAN_CHECK_MIN_ROWS`` rows), none where there is no
    registry. Vectors need no registry: 10 rows were added with the registry server down, until opening it first
    made that exit 75; a registry not answering now leaves the rows unchecked (``check_rows_space``)."""

    def __init__(self, obj: Ctx):
        self.obj = obj

    def space_references(self, dim: int) -> dict:
        return _resolver(self.obj).space_references(dim) if registry_exists(self.obj.settings) else {}


def _record(idx) -> dict:
    """What ``GET /v1/indexes/{name}`` answers (generation and logged deltas included)."""
    return idx.info().to_dict()


def _line(d: dict) -> str:
    params = ",".join(f"{k}={v}" for k, v in sorted(d["params"].items()))
    return (f"{d['name']}  {d['space']}({d['dim']})  {d['kind']}  {d['metric']}  {d['count']} rows  "
            f"generation {d['generation']}  {params}")


_file_opts = [
    click.option("--rows", type=ROWS, default=None,
                 help="START:STOP rows of FILE, or a file of row indices (the .npy `plan --rows-out` writes): those "
                      "rows, in that order (an ids or payloads file: one per row, in the same order)."),
    click.option("--key", default=None, help=".npz array name."),
    click.option("--column", default=None, help="Parquet list column."),
    click.option("--text-field", default="text", show_default=True, help="JSONL field holding the text."),
]


def _with(opts):
    def deco(fn):
        for o in reversed(opts):
            fn = o(fn)
        return fn

    return deco


_write_opts = _with([
    click.argument("file", type=click.Path(dir_okay=False)),
    *_file_opts,
    click.option("--encoder", default=None,
                 help="For a text FILE: the space's encoder (the default; another model is refused), or the "
                      "encoder of a space that has none registered."),
    click.option("--no-store-texts", "store_texts", flag_value=False, default=True,
                 help="Do not keep texts as payloads {\"text\": ...}."),
    click.option("--ids", "ids_file", type=click.Path(dir_okay=False), default=None,
                 help="One id per row, 0 .. 2**61-1: .npy, .json or whitespace-separated text (default: counting "
                      "up from one past the largest id the index ever held; a deleted id is not used again)."),
    click.option("--payloads", "payloads_file", type=click.Path(dir_okay=False), default=None,
                 help="FILE.jsonl: one JSON value per row (null: none), read alongside the rows."),
    json_opt, quiet_opt,
])


def _no_constant(name: str):
    """``json.loads``' ``parse_constant``: NaN / Infinity are not JSON (an HTTP body cannot carry them either)."""
    raise ValueError(f"{name} is not a JSON value")


def _payloads(path: str | None):
    """The values of a JSONL file, one per non-blank line, read lazily (alongside the rows they go with)."""
    if path is None:
        return None
    p = Path(path)
    check_file(p)
    if p.suffix.lower() != ".jsonl":
        raise InputError(f"{p.name}: payloads must be a .jsonl file (one JSON value per line)")

    def values():
        with open(p, encoding="utf-8-sig") as fh:  # -sig: a byte-order mark is no part of line 1's JSON
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line, parse_constant=_no_constant)
                except (json.JSONDecodeError, ValueError, RecursionError) as exc:
                    raise InputError(f"{p.name}: line {i} is not JSON ({exc})") from None
                # as a payload sent over HTTP (one level below the body's `payloads` list): deeper ones could
                # not be served back (the search answer's serialiser stops at 255 levels)
                check_json_depth(value, MAX_JSON_DEPTH - 2, f"{p.name}: line {i}")
                yield value

    return values()


@click.group("index")
def index():
    """FAISS indexes of DATA_DIR/indexes, the ones `vecbridge serve` searches: build, add, delete, search and
    compact them offline (a running server sees each write at its next request)."""


@index.command("list")
@json_opt
@click.pass_obj
def index_list(obj: Ctx, as_json):
    """Every index: space, width, kind, metric, rows, generation."""
    store = _store(obj)
    recs = [_record(i) for i in store.list()]
    for name, why in sorted(store.load_errors.items()):
        warn(f"index {name!r} could not be loaded: {why}")
    if as_json:
        emit({"indexes": recs, "errors": dict(store.load_errors)}, True)
        return
    if not recs:
        click.echo("(no indexes)")
    for d in recs:
        click.echo(_line(d))


@index.command("show")
@click.argument("name")
@json_opt
@click.pass_obj
def index_show(obj: Ctx, name, as_json):
    """One index (the fields of GET /v1/indexes/NAME)."""
    d = _record(_store(obj).get(name))
    if as_json:
        emit(d, True)
        return
    echo_record(d)


@index.command("create")
@click.argument("name")
@click.option("--space", required=True, help="The registered space of the rows (`vecbridge spaces`).")
@_write_opts
@click.option("--kind", type=click.Choice(["auto", "flat", "hnsw", "ivf"]), default="auto", show_default=True,
              help="auto: flat below 50,000 rows, HNSW below 1M, IVF above (by the rows of FILE).")
@click.option("--metric", type=click.Choice(["cosine", "ip"]), default="cosine", show_default=True)
@click.option("--param", "params", multiple=True,
              help="KEY=VALUE FAISS parameter, repeatable: M, ef_construction, ef_search (HNSW); nlist, nprobe, "
                   "train_rows (IVF: rows k-means trains on, nlist..256*nlist, default 64*nlist); the seed is "
                   "--random-state (random_state=N here, as `index show` reports it, when that is not given).")
@random_state_opt
@click.option("--description", default="")
@click.option("--if-not-exists", is_flag=True,
              help="Exit 0 without reading FILE when index NAME exists with the same settings (space, metric, and "
                   "--kind, --param, --random-state where given: auto or a default matches any); one that differs "
                   "is still a conflict (exit 2) naming the setting. --json adds \"created\": true or false.")
@click.pass_obj
def index_create(obj: Ctx, name, space, file, rows, key, column, text_field, encoder, store_texts, ids_file,
                 payloads_file, as_json, quiet, kind, metric, params, random_state, description, if_not_exists):
    """Create index NAME from the rows of FILE (.npy, .npz, .fvecs, .parquet; texts .txt/.jsonl/.json embedded
    with the space's encoder), streamed in blocks; it appears complete or not at all."""
    info = obj.registry.get_space(space)
    store = _store(obj)
    kv = parse_kv(params)
    seed = seed_of(kv, random_state, given := option_given("random_state"))
    exists = partial(_exists, store, name, info.name, kind, metric, kv, seed if given or "random_state" in kv else None,
                     as_json)
    if if_not_exists and name in store.names():
        return exists()
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        idx = create_from_file(_resolver(obj), store, name, info,
                               FileRows(file, rows, key, column, text_field, encoder, store_texts),
                               ids=read_ids(ids_file) if ids_file else None, payloads=_payloads(payloads_file),
                               kind=kind, metric=metric, params=kv, random_state=seed, description=description,
                               progress=progress)
    except IndexConflictError as exc:
        if name not in store.names():
            raise
        if not if_not_exists:  # it said "already exists" alone: the option that accepts an index already made
            raise IndexConflictError(f"{exc}; with --if-not-exists an index of the same settings is kept, not an "
                                     "error (`vecbridge index drop` removes it)") from None
        idx = None  # made by another process while this one read FILE: compared as above
    finally:
        close()
    if idx is None:
        return exists()
    d = _record(idx)
    emit({**d, "created": True} if if_not_exists else d, as_json, f"created {_line(d)}")


def _exists(store, name, space, kind, metric, params, seed, as_json) -> None:
    """``index create --if-not-exists`` of an index that exists: one line (or its record, ``"created": false``) when
    its settings are the command's, else the conflict naming what differs (:func:`check_same_settings`)."""
    idx = store.get(name)
    check_same_settings(idx, space=space, kind=kind, metric=metric, params=params, random_state=seed)
    d = _record(idx)
    emit({**d, "created": False}, as_json, f"index {idx.name} exists with the same settings, left as it is: {_line(d)}")


@index.command("add")
@click.argument("name")
@click.option("--space", default=None, help="The rows' space: refused unless it is the index's. Without it, rows that "
                                            "look like another space's (by the registry's maps) are refused.")
@_write_opts
@click.pass_obj
def index_add(obj: Ctx, name, space, file, rows, key, column, text_field, encoder, store_texts, ids_file,
              payloads_file, as_json, quiet):
    """Add the rows of FILE to index NAME, all as one new generation (all rows or none).

    FILE is read (texts embedded) and checked before the index's writer lock is taken, so other writers of
    NAME wait only while the rows are added and saved; memory: the index plus FILE's rows as float32."""
    idx = _store(obj).get(name)
    src = FileRows(file, rows, key, column, text_field, encoder, store_texts)
    # vectors need no registry: where there is one, its maps' frames tell whether the rows are the index's space's
    resolver = _resolver(obj) if src.texts else _LazyReferences(obj)
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        ids = add_from_file(resolver, idx, src, ids=read_ids(ids_file) if ids_file else None,
                            payloads=_payloads(payloads_file), space=space, progress=progress, warn=warn)
    finally:
        close()
    out = {"index": name, "added": int(ids.size), "first_id": int(ids.min()), "last_id": int(ids.max()),
           "count": idx.count, "generation": idx.generation}
    emit(out, as_json, f"added {ids.size} rows to {name} (ids {ids.min()}..{ids.max()}); {idx.count} rows, "
                       f"generation {idx.generation}")


@index.command("delete")
@click.argument("name")
@click.option("--ids", "ids_file", type=click.Path(dir_okay=False), default=None,
              help="Ids to delete: .npy, .json or whitespace-separated text.")
@click.option("--id", "id_list", type=click.IntRange(0, MAX_ID - 1), multiple=True, help="An id to delete, repeatable.")
@json_opt
@click.pass_obj
def index_delete(obj: Ctx, name, ids_file, id_list, as_json):
    """Delete rows of index NAME by id (ids not in it are ignored)."""
    if ids_file is None and not id_list:
        raise click.UsageError("give --ids FILE or --id N")
    ids = np.concatenate([np.asarray(id_list, np.int64)] + ([read_ids(ids_file).astype(np.int64)] if ids_file else []))
    idx = _store(obj).get(name)
    n = idx.delete(ids)
    emit({"index": name, "deleted": n, "count": idx.count}, as_json,
         f"deleted {n} rows from {name}; {idx.count} rows, generation {idx.generation}")


@index.command("drop")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Really drop it (every row and payload is removed).")
@click.pass_obj
def index_drop(obj: Ctx, name, yes):
    """Drop index NAME (every process stops seeing it at once)."""
    if not yes:
        raise click.UsageError(f"dropping {name!r} removes every row; add --yes")
    _store(obj).delete(name)
    click.echo(f"dropped {name}")


@index.command("search")
@click.argument("name")
@click.argument("queries", type=click.Path(dir_okay=False))
@click.option("--space", default=None, help="The queries' space (default: the index's); another space goes through "
                                            "the registry's path of maps, as over HTTP.")
@click.option("--map", "map_refs", multiple=True,
              help="Pin the map (NAME, NAME@alias, NAME:version) instead; repeat it for a path of maps in order, "
                   "from --space to the index's space (as the HTTP map list).")
@click.option("-k", "--k", "k", type=click.IntRange(1), default=10, show_default=True, help="Hits per query (the HTTP k).")
@click.option("--csls", is_flag=True, help="Re-rank by CSLS (less hubness).")
@click.option("--csls-k", type=click.IntRange(1, MAX_CSLS_K), default=10, show_default=True,
              help=f"Neighbours of CSLS's hubness term (1..{MAX_CSLS_K}, as over HTTP).")
@click.option("--csls-weight", type=FiniteRange(0, 2), default=CSLS_WEIGHT, show_default=True)
@click.option("--exact", is_flag=True, help="Scan every row (no HNSW / IVF approximation).")
@click.option("--ef-search", type=click.IntRange(1, MAX_EF_SEARCH), default=None,
              help=f"HNSW search breadth (1..{MAX_EF_SEARCH}, as over HTTP); HNSW indexes only.")
@click.option("--nprobe", type=click.IntRange(1, MAX_NPROBE), default=None,
              help=f"IVF lists probed (1..{MAX_NPROBE}, as over HTTP; at most the index's nlist); IVF indexes only.")
@click.option("--steer", "steers", multiple=True, help="REF=EPS: a steer of the index's space, repeatable.")
@click.option("--payloads/--no-payloads", "with_payloads", default=None,
              help="Each hit's payload: in --json and --out answers unless --no-payloads (as the HTTP route's "
                   "include_payloads), printed under each query with --payloads.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="FILE.jsonl (one line per query: its hits) or FILE.npz (ids and scores, (n, k); where a "
                   "query has fewer than k hits, ids are -1 and scores -inf).")
@click.option("--search-device", default=None, metavar="DEVICE",
              help="cpu (FAISS) or cuda / cuda:N: a flat index searched on that GPU, as `serve --search-device` "
                   "[env VECBRIDGE_SEARCH_DEVICE; default cpu].")
@_with(_file_opts)
@json_opt
@click.pass_obj
def index_search(obj: Ctx, name, queries, space, map_refs, k, csls, csls_k, csls_weight, exact, ef_search, nprobe,
                 steers, with_payloads, out, search_device, rows, key, column, text_field, as_json):
    """Search index NAME with the rows of QUERIES (vectors, or texts embedded with the query space's encoder)."""
    device = search_device or obj.settings.search_device  # the option wins over the variable
    if device != "cpu":
        search_on(device, source="--search-device" if search_device else "VECBRIDGE_SEARCH_DEVICE")
    if out is not None and Path(out).suffix.lower() not in (".jsonl", ".npz"):
        raise InputError(f"--out {out}: write .jsonl or .npz")
    if out is not None:
        check_not_input(out, "--out", queries)
        check_writable(out, "--out")
    idx = _store(obj).get(name)
    src = FileRows(queries, rows, key, column, text_field)
    n = count(src)
    limits = obj.settings.limits
    index_ops.check_hits(1, k, limits)
    per = max(1, min(CHUNK_ROWS, limits.max_hits // k))
    npz = out is not None and Path(out).suffix.lower() == ".npz"  # ids and scores only: no payloads, no hit dicts
    keep = not npz and with_payloads is not False and (with_payloads or as_json or out is not None)
    kw = {"space": space, "map_ref": list(map_refs) or None, "k": k, "exact": exact, "ef_search": ef_search,
          "nprobe": nprobe, "csls_k": csls_k if csls else 0, "csls_weight": csls_weight, "limits": limits,
          "steers": _steers(steers), "with_payloads": keep, "space_option": "--space", "warn": warn}
    if src.texts:
        texts = read_texts(queries, rows=parse_rows(rows), text_field=text_field)
        parts = ({"texts": texts[s:s + per]} for s in range(0, n, per))
    else:
        parts = ({"Q": Q} for Q in iter_chunks(queries, chunk_rows=per, rows=rows, key=key, column=column))
    found_blocks = index_ops.search_parts(_resolver(obj), idx, parts, **kw)  # every block through the same maps
    if out is not None:
        head = _write_hits(Path(out), idx, found_blocks, keep, npz, n, k)
        emit({**head, "queries": n, "out": str(out)}, as_json, f"wrote the hits of {n} queries to {out}")
        return
    blocks = _hit_blocks(idx, found_blocks, keep)  # one block's hits at a time
    if as_json:
        head, lines = {}, []
        for found_head, hs in blocks:
            head = head or found_head
            lines.append(hs)
        emit({**head, "results": lines}, True)
        return
    for q, (_, hs) in enumerate(blocks):
        click.echo(f"query {q}: " + "  ".join(f"{h['id']} ({h['score']:.4f})" for h in hs))
        if with_payloads:
            for h in hs:
                click.echo(f"  {h['id']}: {json.dumps(h.get('payload'), ensure_ascii=False)}")


def _write_hits(path: Path, idx, found_blocks, keep: bool, npz: bool, n: int, k: int) -> dict:
    """Write ``--out`` (see :func:`_write_out`) from the searched blocks; returns the answer's head. ``.npz`` fills
    only the (n, k) ids and scores; ``.jsonl`` writes each block's hits as it is reached (none kept)."""
    head: dict = {}
    if npz:
        S, I, r = np.zeros((n, k), np.float32), np.full((n, k), -1, np.int64), 0
        for found in found_blocks:
            head = head or found.describe()
            S[r:r + found.S.shape[0]], I[r:r + found.S.shape[0]] = found.S, found.I
            r += found.S.shape[0]
        _write_out(path, lambda fh: np.savez(fh, ids=I, scores=S, head=np.array(json.dumps(head))))
        return head

    def write(fh) -> None:
        for q, (found_head, hs) in enumerate(_hit_blocks(idx, found_blocks, keep)):
            if q == 0:
                head.update(found_head)
                fh.write(json.dumps(head, default=str) + "\n")
            fh.write(json.dumps({"query": q, "hits": hs}, ensure_ascii=False) + "\n")

    _write_out(path, write)
    return head


def _hit_blocks(idx, found_blocks, keep: bool):
    """``(head, hits)`` of each query, block by block: each block's hit dicts built as it is reached, none kept."""
    for found in found_blocks:
        head = found.describe()
        P = found.P if keep and found.P else [None] * found.S.shape[0]
        for row_i, row_s, row_p in zip(found.I.tolist(), found.S.tolist(), P):
            yield head, index_ops.hits(idx, row_i, row_s, keep, row_p)


def _steers(items) -> dict[str, float]:
    """``("REF=EPS", ...)`` -> ``{ref: eps}``; a non-numeric EPS is a usage error."""
    out = parse_kv(items, "steer")
    bad = [r for r, e in out.items() if isinstance(e, bool) or not isinstance(e, (int, float))]
    if bad:
        raise click.UsageError(f"--steer {bad[0]}=EPS: EPS must be a number")
    return {r: float(e) for r, e in out.items()}


def _write_out(path: Path, write) -> None:
    """``--out``, written atomically by ``write(fh)`` (binary for ``.npz``, else UTF-8 text). ``.jsonl``: the
    answer's head on line 1, then ``{"query": i, "hits": [...]}`` per query; ``.npz``: ``ids`` and ``scores``
    (n, k), ``-1`` ids and ``-inf`` scores where fewer hits."""
    binary = path.suffix.lower() == ".npz"

    def save(tmp: Path) -> None:
        with open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8") as fh:
            write(fh)
    atomic_write(path, save)


@index.command("compact")
@click.argument("name", required=False)
@click.option("--all", "all_", is_flag=True, help="Every index of the data dir.")
@json_opt
@click.pass_obj
def index_compact(obj: Ctx, name, all_, as_json):
    """Write a snapshot of index NAME now (its log of deltas replayed into one file); an index whose newest
    generation is a snapshot already is left as it is. Before going back to a release that reads snapshots
    only (RELIABILITY.md): stop the servers, then `vecbridge index compact --all`."""
    if bool(name) == bool(all_):
        raise click.UsageError("give NAME or --all")
    store = _store(obj)
    done, failed = [], {}
    for n in store.names() if all_ else [name]:
        try:
            idx = store.get(n)
            was = idx.logged_deltas
            if was:
                idx.save()
        except Exception as exc:  # every index is tried; each failure said, then the exit code
            if not all_:
                raise
            failed[n] = exc
            click.echo(f"vecbridge: error: index {n!r}: {str(exc).strip() or type(exc).__name__}", err=True)
            continue
        done.append({"index": n, "generation": idx.generation, "compacted_deltas": was})
        if not as_json:
            click.echo(f"{n}: generation {idx.generation} is a snapshot"
                       + (f" ({was} logged deltas folded in)" if was else " (already)"))
    if as_json:
        emit({"compacted": done, "failed": {n: str(e) for n, e in failed.items()}}, True)
    if failed:  # 75 (retry later) only when every failure is one a retry can fix: retrying fixes no other
        codes = {exit_code(e) for e in failed.values()}
        raise click.exceptions.Exit(max(codes - {EX_TEMPFAIL}, default=EX_TEMPFAIL))
