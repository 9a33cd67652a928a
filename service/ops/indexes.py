"""Index use cases for every face: create an index or add rows (vectors or texts), and search from any space.

Rows given as ``texts`` are embedded with the space's encoder in its passage form and, unless
told otherwise, stored as payloads ``{"text": ...}``. Under :func:`service.progress.run_stoppable` (the HTTP face,
for a client that may leave) the embedding stops at the encoder's next batch once told to, before anything is
written (no row, no id drawn, no index created); the write itself, once begun, is :func:`~service.progress.unstoppable`:
it finishes, or fails and leaves the index as it was.

Search, for queries ``Q`` (n, d_q) in space ``s_q`` against an index of space ``s`` (rows d):

1. ``texts`` instead of vectors: ``Q = encoder(s_q).encode(texts, kind="query")``;
2. ``s_q != s`` (or a pinned ``map_ref``: one map, or a path of them): ``Q <- Q H`` with ``H`` the chain of
   maps ``s_q -> s`` (the registry's, or the pinned one) composed (raw output, (n, d)); rows of another width
   than ``s_q``'s, or all-zero rows (the map would send them to its offset), are refused first;
3. the answer's size is bounded before any search: ``k <= max_k``, ``n k <= max_hits``;
4. steers ``{W_i: eps_i}`` of ``s``: ``Q <- Q (I + sum_i eps_i W_i)``;
5. one FAISS search, top ``k`` by cosine (or inner product), CSLS re-ranking when ``csls_k > 0``.

Everything is looked up through ``resolver`` (the service's app state: spaces, map chains,
steers and encoders cached per registry generation), so a search costs no registry or
file-system round trip beyond the index's one ``stat`` (:meth:`service.indexes.SpaceIndex.refresh`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from align.exceptions import DimensionMismatchError, InputError, VecbridgeError
from align.validation import as_matrix, check_no_zero_rows

from ..encoders import UnknownEncoderError, get_encoder
from ..errors import ConflictError
from ..indexes import IndexStore, SpaceIndex
from ..indexes.csls import CSLS_WEIGHT
from ..indexes.kinds import NO_DIRECTION
from ..logging import Every, get_logger
from ..progress import checkpoint, unstoppable
from ..spaces import check_rows, index_frame, space_references
from .steers import steer_queries

__all__ = ["Resolver", "RegistryResolver", "Translation", "translation", "leads", "space_encoder", "SearchResult",
           "embed_texts", "create_index", "add_rows", "query_dim", "check_k", "check_hits", "search", "search_parts",
           "check_search_knobs", "hits", "short_note", "check_rows_space", "unchecked_log"]

log = get_logger("indexes")


#: the rows-check log lines of searches and adds (HTTP), once a minute per index
unchecked_log = Every(60.0)


class Resolver(Protocol):
    """What search needs from the service (``service.api.state.AppState`` is one)."""

    def get_space(self, name: str) -> Any: ...

    def translation(self, source_space: str, target_space: str, map_ref: str | Sequence[str] | None = None
                    ) -> Any: ...

    def resolve_steer(self, ref: str) -> tuple[Any, Any]: ...

    def encoder_for_space(self, space: str) -> tuple[Any, Any]: ...

    # optional: space_references(dim) -> {space: [service.spaces.Reference]} (without it, rows' spaces go unchecked)


@dataclass
class Translation:
    """A map (possibly composed) from one space to another, and the versions it is made of."""

    map: Any  # LinearMap | ClusterMap | MapChain, or None: the same space, nothing to do
    versions: list = field(default_factory=list)  # the VersionInfo of each map along the path

    def describe(self) -> list[dict]:
        return [{"name": v.name, "version": v.version, "source_space": v.source_space,
                 "target_space": v.target_space} for v in self.versions]


def translation(registry, source_space: str, target_space: str, map_ref: str | Sequence[str] | None = None, *,
                path_alias: str | None = None, resolve: Callable | None = None,
                find_path: Callable[[], list] | None = None, load: Callable | None = None) -> Translation:
    """The map from ``source_space`` to ``target_space``: ``map_ref`` if given, else the registry's path of maps
    (``path_alias`` first; None: the registry's own, its setting), composed.

    ``map_ref``: one map (``name``, ``name@alias``, ``name:N``), or a path of them in order (a list: the first
    from ``source_space``, each next from the previous one's target space, the last into ``target_space``),
    composed as the registry's own path would be. A map or path that goes elsewhere is an InputError. A client
    sending one query set in several requests names the versions the first answer used (its ``maps``), so every
    batch goes through the same maps whatever aliases move meanwhile.

    ``resolve(ref)``, ``find_path()`` and ``load(version)`` default to the registry's own lookups (the app passes
    its cached ones: a search naming its map must not read the artifact from disk at every request).
    An empty path (no maps) gives ``Translation(None, [])``; the registry raises NotFoundError when none exists.
    """
    if map_ref:
        chain = [(resolve or registry.resolve)(r) for r in ([map_ref] if isinstance(map_ref, str) else map_ref)]
        if not leads(chain, source_space, target_space):
            hops = ", ".join(f"{v.ref} goes {v.source_space} -> {v.target_space}" for v in chain)
            raise InputError(f"map {hops}, but the request needs {source_space} -> {target_space}"
                             + (" (a path names its maps in order, each from the previous one's target space)"
                                if len(chain) > 1 else ""))
        return Translation((load or registry.load_map)(chain[0]) if len(chain) == 1 else registry.compose(chain),
                           chain)
    chain = find_path() if find_path else registry.find_path(source_space, target_space, path_alias)
    return Translation(registry.compose(chain) if chain else None, chain)


def leads(chain: list, source_space: str, target_space: str) -> bool:
    """Whether the versions ``chain`` (a non-empty list; each has ``source_space`` / ``target_space``) lead, one
    after the other, from ``source_space`` to ``target_space``."""
    return ([v.source_space for v in chain] == [source_space, *(v.target_space for v in chain[:-1])]
            and chain[-1].target_space == target_space)


def space_encoder(registry, space: str, load_encoder: Callable[[str], Any]) -> tuple[Any, Any]:
    """``(encoder, SpaceInfo)`` of ``space``: its registered encoder loaded by ``load_encoder(name)``;
    UnknownEncoderError when the space has none (texts cannot be embedded in it)."""
    info = registry.get_space(space)
    if not info.encoder:
        raise UnknownEncoderError(
            f"space {space!r} has no encoder registered, so texts cannot be embedded in it (a space `fit` made records "
            f"none): register its model with `vecbridge spaces add {space} --encoder NAME` (POST /v1/spaces "
            f"{{\"name\": \"{space}\", \"encoder\": NAME}}), or send vectors")
    return load_encoder(info.encoder), info


class RegistryResolver:
    """A :class:`Resolver` straight over a registry, without caches: for one-shot faces (the CLI), so they
    resolve spaces, paths of maps, steers and encoders as the service does (``path_alias``: its setting)."""

    def __init__(self, registry, path_alias: str | None = None, load_encoder: Callable[[str], Any] | None = None):
        self.registry, self.path_alias = registry, path_alias
        self.load_encoder = load_encoder or get_encoder

    def get_space(self, name: str):
        return self.registry.get_space(name)

    def translation(self, source_space: str, target_space: str, map_ref: str | Sequence[str] | None = None
                    ) -> Translation:
        return translation(self.registry, source_space, target_space, map_ref, path_alias=self.path_alias)

    def resolve_steer(self, ref: str):
        info = self.registry.resolve_steer(ref)
        return info, self.registry.load_steer(info)

    def encoder_for_space(self, space: str):
        return space_encoder(self.registry, space, self.load_encoder)

    def space_references(self, dim: int) -> dict:
        return space_references(self.registry, dim)


@dataclass
class SearchResult:
    """Scores ``S`` (n, k) and ids ``I`` (n, k; -1 where fewer rows), and how they were obtained."""

    S: np.ndarray
    I: np.ndarray
    index: SpaceIndex
    query_space: str
    k: int
    csls: bool
    translation: Any = None  # the map chain used (``.versions``, ``.describe()``), None for the same space
    steers: list[dict] = field(default_factory=list)
    P: list | None = None  # payloads (n lists of k), read with the search (``with_payloads``), else None

    def describe(self) -> dict:
        """The answer's head: index, spaces, k, scoring, the map versions and steers used."""
        return {"index": self.index.name, "space": self.index.space, "query_space": self.query_space, "k": self.k,
                "scoring": "csls" if self.csls else self.index.metric,
                "maps": self.translation.describe() if self.translation is not None else [], "steers": self.steers}


def embed_texts(resolver: Resolver, space: str, texts: list[str], kind: str) -> np.ndarray:
    """``texts`` embedded with ``space``'s encoder (``kind``: ``"query"`` or ``"passage"``): (n, d) float32."""
    enc, _ = resolver.encoder_for_space(space)
    return np.asarray(enc.encode(texts, kind=kind), dtype=np.float32)


def _passages(resolver: Resolver, space: str, texts: list[str], payloads: list | None,
              store_texts: bool) -> tuple[np.ndarray, list | None]:
    X = embed_texts(resolver, space, texts, "passage")
    checkpoint()  # the last batch embedded: a client gone meanwhile still stops here, before the write begins
    if payloads is None and store_texts:
        payloads = [{"text": t} for t in texts]
    return X, payloads


def create_index(resolver: Resolver, store: IndexStore, name: str, space, X: np.ndarray | None = None, *,
                 texts: list[str] | None = None, store_texts: bool = True, payloads: list | None = None,
                 **build) -> SpaceIndex:
    """Create index ``name`` in ``space`` (a SpaceInfo: ``name``, ``dim``) from rows ``X`` (n, dim), ``texts``
    or nothing (empty); ``build``: ``ids``, ``kind``, ``metric``, ``params``, ``random_state``, ``description``.

    Rows of another width are a DimensionMismatchError; an existing name an IndexConflictError.
    """
    if texts is not None:
        X, payloads = _passages(resolver, space.name, texts, payloads, store_texts)
    if X is not None and X.shape[1] != space.dim:
        raise DimensionMismatchError(f"space {space.name!r} is {space.dim}-d, vectors have {X.shape[1]} columns")
    with unstoppable():
        return store.create(name, space.name, X, payloads=payloads, dim=space.dim,
                            before_commit=space_still_there(resolver, space), **build)


def space_still_there(resolver: Resolver | None, space) -> Callable[[], None] | None:
    """``create``'s last check, under the index store's lock: ``space`` (a SpaceInfo) still registered with its
    width. A space deleted while its index was built (minutes) got the index anyway, and one re-created with
    another width then had an index of the old one: NotFoundError / ConflictError instead, nothing created.
    None without a resolver (rows only, no registry to ask)."""
    if resolver is None:
        return None

    def check() -> None:
        now = resolver.get_space(space.name)
        if now.dim != space.dim:
            raise ConflictError(f"space {space.name!r} was re-created as {now.dim}-d while this {space.dim}-d "
                                f"index was built; nothing was created")
    return check


def add_rows(resolver: Resolver, idx: SpaceIndex, X: np.ndarray | None = None, *, texts: list[str] | None = None,
             store_texts: bool = True, ids=None, payloads: list | None = None, space: str | None = None,
             warn: Callable[[str], None] | None = None) -> np.ndarray:
    """Add rows ``X`` (n, dim) or ``texts`` to ``idx`` under ``ids`` (default: counting up from one past the largest
    id it ever held, :meth:`SpaceIndex.add`); returns the ids. ``space``: the rows' space, as ``index add --space``:
    the index's own skips the rows check, another is refused (rows are not mapped here). ``warn(note)``: rows the
    check could not tell (:func:`check_rows_space`), a registry not answering among them."""
    if space is not None and space != idx.space:
        raise InputError(f"index {idx.name!r} holds space {idx.space!r}; rows of space {space!r} would not be "
                         f"comparable with it (map them first: POST /v1/maps/MAP/transform, MAP a map from {space!r})")
    if texts is not None:
        X, payloads = _passages(resolver, idx.space, texts, payloads, store_texts)
    elif space is None:  # texts are embedded by the space's own encoder: vectors may be another model's
        check_rows_space(resolver, idx, X, "the vectors",
                         f"map them into {idx.space!r} first (POST /v1/maps/MAP/transform, MAP a map from {{other}}), "
                         f"or add them to an index of space {{other}}; \"space\": \"{idx.space}\" in the body "
                         f"declares them {idx.space!r} rows", warn)
    with unstoppable():
        return idx.add(X, ids=ids, payloads=payloads)


def check_rows_space(resolver: Resolver | None, idx: SpaceIndex, X, name: str, fix: str,
                     warn: Callable[[str], None] | None = None, space: str | None = None, wait: bool = True) -> None:
    """Rows ``X`` (n, dim) declared of ``space`` (default: ``idx``'s) checked against the references of the spaces
    the registry's maps touch and, where a refusal is in question, ``idx``'s own rows
    (:func:`service.spaces.check_rows`: SpaceMismatchError naming the space they look like and ``fix``, in which
    ``{other}`` is that space). Nothing for fewer than ``MEAN_CHECK_MIN_ROWS`` rows, rows of another width (refused
    by width where they are used), or a resolver without references. ``warn(note)``: rows references exist for
    but none recognises, or rows left unchecked because the registry did not answer (they go on, as rows of the
    index's space need no registry; logged instead where there is no ``warn``). ``wait=False``: WouldBlock rather
    than wait for a writer of ``idx`` (its own rows)."""
    refs = getattr(resolver, "space_references", None)
    if refs is None or X is None or getattr(X, "ndim", 0) != 2 or X.shape[1] != idx.dim:
        return
    space = space or idx.space
    unanswered: list[VecbridgeError] = []

    def references() -> dict:
        try:
            return refs(idx.dim)
        except VecbridgeError as e:  # a registry not answering: the rows go on unchecked, and the caller is told
            if e.kind != "unavailable":
                raise
            unanswered.append(e)
            return {}
    check_rows(X, space, references, name=name, fix=fix, warn=warn,
               own_extra=(lambda: index_frame(idx, wait=wait)) if space == idx.space else None)
    if unanswered:  # the rows went on as the index's space's without a word: 90 rows of another model went in
        # (no references, so check_rows warned of nothing: this is the one note)
        why = (str(unanswered[0]).strip().splitlines() or [type(unanswered[0]).__name__])[0]
        note = (f"{name} are unchecked by rows: the registry did not answer ({why}), so "
                f"whether they are {space!r} rows was not compared with its maps; they were taken as {space!r} rows")
        if warn is None and unchecked_log.due(idx.name):  # no one to tell (an HTTP search): the operator reads
            # the log, once a minute per index at most (every search of 50+ queries meets a registry that is down)
            log.warning("rows unchecked: registry unavailable", extra={"fields": {
                "index": idx.name, "space": space, "rows": int(X.shape[0]), "error": why}})
        if warn is not None:
            warn(note)


def query_dim(resolver: Resolver, idx: SpaceIndex, space: str | None,
              map_ref: str | Sequence[str] | None = None) -> int:
    """Width of query vectors from ``space`` (default: the index's own). A pinned ``map_ref`` is first checked to
    lead from that space to the index's (InputError saying where it goes): else the rows' width took the blame."""
    if map_ref:
        resolver.translation(space or idx.space, idx.space, map_ref)
    return resolver.get_space(space).dim if space and space != idx.space else idx.dim


def check_k(k: int, limits) -> None:
    """``k <= max_k`` (422): the one bound of ``k`` and its one message (HTTP checks it as the body is parsed)."""
    if k > limits.max_k:
        raise InputError(f"k={k} exceeds the limit of {limits.max_k} results per query (limits.max_k)")


def check_hits(n_queries: int, k: int, limits) -> None:
    """Bound the answer before searching: ``k <= max_k`` and ``queries x k <= max_hits`` (422)."""
    check_k(k, limits)
    if n_queries * k > limits.max_hits:
        raise InputError(f"{n_queries} queries x k={k} = {n_queries * k} hits exceed the limit of {limits.max_hits} "
                         f"per request (limits.max_hits); send fewer queries per request or a smaller k")


ZERO_MAPPED = "a zero query has no direction, and a map would send it to its offset, to be ranked as a real query"


def search(resolver: Resolver, idx: SpaceIndex, Q: np.ndarray | None = None, *, texts: list[str] | None = None,
           space: str | None = None, map_ref: str | Sequence[str] | None = None, k: int = 10, exact: bool = False,
           ef_search: int | None = None, nprobe: int | None = None, csls_k: int = 0, csls_weight: float = CSLS_WEIGHT,
           steers: dict[str, float] | None = None, limits, wait: bool = True, with_payloads: bool = False,
           finite: bool = False, space_option: str = "space", warn: Callable[[str], None] | None = None
           ) -> SearchResult:
    """Search ``idx`` with queries ``Q`` (n, d_q) — or ``texts`` — from ``space`` (steps in the module notes).

    ``csls_k > 0`` re-ranks by CSLS (document term scaled by ``csls_weight``); ``limits`` (``max_k``,
    ``max_hits``) bound the answer.
    Unknown spaces, maps or steers raise NotFoundError; no path of maps, InputError / NotFoundError.
    ``wait=False``: the index's :class:`~service.indexes.locking.WouldBlock` rule (see ``SpaceIndex.search``).
    ``finite=True``: the caller has checked that ``Q`` holds no NaN/Inf (a decoded request,
    :func:`service.api.codec.vectors_from_json`), so the index does not check it again (``texts`` are embedded here
    and always checked); every other check of ``Q`` is made.
    Vectors with no ``space`` (nor ``map_ref``) are taken for the index's space: :func:`check_rows_space` refuses
    ones that look like another space's (``space_option``: how the caller names the space, for its hint; ``warn``:
    as there). A batch of fewer than ``MEAN_CHECK_MIN_ROWS`` queries is not checked.
    """
    check_search_knobs(idx, exact=exact, ef_search=ef_search, nprobe=nprobe, cli=space_option.startswith("--"))
    qspace = space or idx.space
    if texts is not None:
        Q, finite = embed_texts(resolver, qspace, texts, "query"), False
    elif space is None and not map_ref:
        fix = (f"if they are queries of space {{other}}, say so with {space_option} {{other}} (they then go through "
               f"the registry's maps); {space_option} {idx.space} declares them {idx.space!r} queries")
        check_rows_space(resolver, idx, Q, "the queries", fix, warn, wait=wait)
    tr = resolver.translation(qspace, idx.space, map_ref) if (qspace != idx.space or map_ref) else None
    if tr is not None and tr.map is not None:
        Q = as_matrix(Q, name="vectors", dim=tr.map.source_dim, finite=False)  # the width, as HTTP checks it
        # refused as the index refuses it unmapped: an affine map would send a zero row to its offset, a real query
        check_no_zero_rows(Q, name="queries", why=NO_DIRECTION if idx.metric == "cosine" else ZERO_MAPPED)
        # a NaN row unchecked by the caller is named as such (validate), not as an overflow; the output is finite
        Q, finite = tr.map.apply(Q, output="raw", validate=not finite, name="queries"), True
    check_hits(Q.shape[0], k, limits)
    Q, used_steers = steer_queries(Q, steers or {}, idx.space, load_steer=resolver.resolve_steer)
    S, I, *P = idx.search(Q, k, exact=exact, ef_search=ef_search, nprobe=nprobe, csls_k=csls_k,
                          csls_weight=csls_weight, wait=wait, with_payloads=with_payloads,
                          finite=finite and not used_steers)
    return SearchResult(S, I, idx, qspace, k, csls_k > 0, tr, used_steers, P[0] if P else None)


#: the search option each index kind has: ``ef_search`` (HNSW's breadth), ``nprobe`` (IVF's lists probed)
KNOBS = {"ef_search": "hnsw", "nprobe": "ivf"}


def check_search_knobs(idx: SpaceIndex, *, exact: bool, ef_search: int | None, nprobe: int | None,
                       cli: bool = False) -> None:
    """InputError (422, exit 2) for a search option the index has no use for: ``ef_search`` on an index that is not
    HNSW, ``nprobe`` on one that is not IVF, either with ``exact`` (every row is scored). They were dropped silently,
    so a client tuning recall saw no change and no word why. An index's kind is fixed when it is created (``GET
    /v1/indexes/{name}`` and ``vecbridge index info`` show it). ``cli``: name the flags (``--ef-search``)."""
    def word(key: str) -> str:
        return "--" + key.replace("_", "-") if cli else key

    for key, value in (("ef_search", ef_search), ("nprobe", nprobe)):
        if value is None:
            continue
        if idx.kind != KNOBS[key]:
            other = next((k for k, kind in KNOBS.items() if kind == idx.kind), None)
            has = (f"its search option is {word(other)}" if other else "it scores every row: no option tunes it")
            raise InputError(f"{word(key)} is an {KNOBS[key].upper()} index's search option; index {idx.name!r} is "
                             f"{idx.kind} ({has}): leave {word(key)} out")
        if exact:
            raise InputError(f"{word(key)} has no effect with {word('exact')}: an exact search scores every row of "
                             f"index {idx.name!r}; give one of them")


def search_parts(resolver: Resolver, idx: SpaceIndex, parts: Iterable[dict], **kw) -> Iterator[SearchResult]:
    """:func:`search` of each of ``parts`` (``{"Q": (m, d_q)}`` or ``{"texts": [...]}``: one query set cut in
    blocks; ``kw`` as :func:`search`'s), every block through the maps and steers the first one used, named by
    version: an alias moved (or a version registered) meanwhile changes no block after the first (as the Python
    client pins its batches, :func:`service.client_wire.pinned`; the eps of two refs to one steer version summed,
    ``sum eps_i W_i`` alike)."""
    for part in parts:
        found = search(resolver, idx, **part, **kw)
        kw["space"] = kw.get("space") or idx.space  # the first block's space check stands for the others
        if found.translation is not None and found.translation.versions:
            kw["map_ref"] = [v.ref for v in found.translation.versions]
        if found.steers:
            kw["steers"] = {}
            for s in found.steers:
                ref = f"{s['name']}:{s['version']}"
                kw["steers"][ref] = kw["steers"].get(ref, 0.0) + s["eps"]
        yield found


def short_note(found: SearchResult, *, exact: bool = False, nprobe: int | None = None) -> str | None:
    """The answer's ``note`` when some query got fewer than ``k`` hits (None when every one got ``k``), saying why:
    an index of fewer live rows than ``k``, or an approximate search that reached fewer (an IVF index whose
    ``nprobe`` lists probed held fewer rows: a sparse index; deleted rows skipped). The answer said nothing, and a
    client took the short lists for all there was."""
    I = found.I
    short = int(np.count_nonzero((I < 0).any(axis=1))) if I.size else 0
    if not short:
        return None
    idx, k = found.index, found.k
    head = f"{short} of {I.shape[0]} queries got fewer than k={k} hits"
    if idx.count < k:
        return f"{head}: the index holds {idx.count} rows"
    if idx.kind == "ivf" and not exact:
        nlist = idx.params.get("nlist")
        return (f"{head}: the {nprobe or idx.params.get('nprobe')} IVF lists probed (of nlist={nlist}) held fewer "
                f"rows; raise nprobe (at most {nlist}) or search with exact=true")
    knob = "raise ef_search or " if idx.kind == "hnsw" and not exact else ""
    return f"{head}: fewer rows were reached (deleted rows are skipped); {knob}search with exact=true"


def hits(idx: SpaceIndex, row_i: list, row_s: list, with_payloads: bool, row_p: list | None = None) -> list[dict]:
    """One query's answer: ``[{"id", "score"[, "payload"]}, ...]`` of its row of ids / scores (``-1`` ids left out).

    ``row_p``: the row's payloads as the search read them (``SearchResult.P``); without, they are read from ``idx``
    now, which a write since the search may have changed (a row deleted since: ``null``)."""
    # comprehensions, not a loop with a test per hit: the hits of a search of 64 x 10 took ~0.1 ms that way
    if not with_payloads:
        return [{"id": i, "score": sc} for i, sc in zip(row_i, row_s) if i >= 0]
    if row_p is None:
        payload = idx.payloads.get
        return [{"id": i, "score": sc, "payload": payload(i)} for i, sc in zip(row_i, row_s) if i >= 0]
    return [{"id": i, "score": sc, "payload": p} for i, sc, p in zip(row_i, row_s, row_p) if i >= 0]
