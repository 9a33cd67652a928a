"""A thin Python client for the vecbridge HTTP API (httpx + numpy; no server code imported), e.g.::

    from service.client import Client
    vb = Client("http://127.0.0.1:8000", api_key="change-me")
    Y = vb.transform("demo-minilm-e5", X)           # (n, 384) float32 in, (n, 384) float32 out
    job = vb.wait(vb.fit("a2b", "a", "b", Xa, Xb, method="procrustes", paired=True)["id"],
                  progress=lambda j: print(j["progress"]))
    vb.search("docs-e5", queries, space="minilm", k=5)["results"]

From asyncio, :class:`AsyncClient` has every method as a coroutine (same arguments, answers, errors, retries,
batches; one implementation runs both clients, :mod:`service.client_core`)::

    async with AsyncClient("http://127.0.0.1:8000", api_key="change-me") as vb:
        Y = await vb.transform("demo-minilm-e5", X)

Every method is one request (retried as below; list methods follow ``next`` cursors until the last page; rows
beyond the service's limits (``max_batch``, the body limits, a search's ``max_hits``) go in batches, see
``batch_size``) and returns the decoded JSON answer, or numpy arrays where the route carries vectors. Vectors go
out as base64 float32 inside JSON (``vectors_b64`` + ``dim``), and :meth:`Client.transform` sends raw
little-endian float32 (``application/octet-stream``) by default: no JSON numbers to parse on either side.
``binary=False`` sends the same request as JSON. Version numbers must be integers (``InputError`` otherwise).

Errors: a 4xx/5xx answer raises the :class:`APIError` subclass of its status, carrying the server's
``{"error": {"type", "status", "message"}}`` and the ``X-Request-ID`` to quote in a bug report::

    APIError (VecbridgeError)   any error answer: .status, .type, .message, .request_id, .body, .kind, .details
     +-- BadRequestError             400
     +-- AuthenticationError         401  missing or unknown API key
     +-- PermissionDeniedError       403  the key lacks the route's scope
     +-- NotFoundError               404  unknown space, map, version, alias, index, job, steer
     +-- ConflictError               409  deleted version, taken name, reused idempotency key
     |    +-- PreconditionFailedError     412  If-Match did not hold (an alias moved, a version changed)
     +-- PayloadTooLargeError        413  body or batch over the service's limits
     +-- UnsupportedMediaTypeError   415
     +-- ValidationError             422  shape, dimension, NaN/Inf, bad name or option
     +-- QueueFullError              429  .retry_after seconds
     +-- ServerError                 5xx
     |    +-- ServiceUnavailableError     503  registry or language model not ready
     +-- UnexpectedResponseError     an answer that is not the API's (a proxy's page, a cut body, a redirect)
    APIConnectionError (VecbridgeError, httpx.TransportError)   no answer: refused, reset, server gone
     +-- APITimeoutError         no answer within ``timeout``
     +-- ClientClosedError       a call after ``close()``: nothing sent, never retried
    EventLoopError (VecbridgeError, RuntimeError)   an AsyncClient called from a loop other than the one it serves
    JobError                    :meth:`Client.wait` on a job that failed or was cancelled: .job
     +-- JobFailedError
     +-- JobCancelledError
     +-- JobTimeoutError (also TimeoutError)   still running at ``wait``'s ``timeout``

Arrays the client cannot send as float32 are refused before anything is sent, with :mod:`align.exceptions`'
errors (``ShapeError``, ``NotRepresentableError``, ``InputError``; all ``ValueError``); the service judges the
rest (NaN, dimensions: 422).

Retries: a request that got no answer, or a 429 / 502 / 503 / 504, is sent again up to ``max_retries`` times
(default 2; 0: none) after 0.5 s, 1 s, 2 s ... or the answer's ``Retry-After`` (one over ``max_retry_wait`` is raised
at once) where sending it twice cannot do twice what was asked: GET / PUT / DELETE, POSTs that only read (transform,
search, embeddings, steer apply, plans, evaluate, LM generate / analyze, deleting index rows), and jobs (fits ...),
which carry an ``Idempotency-Key`` (made per call unless given; a no-answer error's ``.idempotency_key``). A timed-out
request is sent again only with one; one never sent or answered 429 (refused before work), always; a bare 503, never.
"""

from __future__ import annotations

import inspect
import io
import math
import numbers
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import numpy as np

from .client_core import (
    AsyncDriven,
    Await,
    Calls,
    Sleep,
    SyncDriven,
    call,
    partly_added,
    retriable,
)
from .client_errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ClientClosedError,
    ConflictError,
    EventLoopError,
    JobCancelledError,
    JobError,
    JobFailedError,
    JobTimeoutError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    PreconditionFailedError,
    QueueFullError,
    ServerError,
    ServiceUnavailableError,
    UnexpectedResponseError,
    UnsupportedMediaTypeError,
    ValidationError,
    error_from_response,
    unexpected,
)
from .client_embed import EmbedCalls
from .client_steers import SteerCalls
from .client_tags import TagCalls, VersionRecord
from .client_wire import (
    Artifact,
    alias_if_match,
    as_flag,
    as_ints,
    as_list,
    b64,
    b64_row_bytes,
    clean,
    cut,
    float32_rows,
    json_sizes,
    labelled,
    matrix,
    new_key,
    pinned,
    rows,
    side,
)
from .client_wire import seg as _seg

__all__ = [
    "APIConnectionError", "APIError", "APITimeoutError", "Artifact", "AsyncClient", "AuthenticationError",
    "BadRequestError", "Client", "ClientClosedError", "ConflictError", "EventLoopError", "JobCancelledError",
    "JobError", "JobFailedError", "JobTimeoutError", "NotFoundError", "PayloadTooLargeError", "PermissionDeniedError",
    "PreconditionFailedError", "QueueFullError", "ServerError", "ServiceUnavailableError", "UnexpectedResponseError",
    "UnsupportedMediaTypeError", "ValidationError", "VersionRecord", "error_from_response",
]

TERMINAL = ("succeeded", "failed", "cancelled")


# --- the calls (each written once: service.client_core) ------------------------------------------
class APICalls(EmbedCalls, SteerCalls, TagCalls, Calls):
    """Every call of the API as a sans-IO generator (:mod:`service.client_core`); :class:`Client` runs them on
    ``httpx.Client``, :class:`AsyncClient` on ``httpx.AsyncClient``. Not for direct use."""

    # --- ops ------------------------------------------------------------------------------------
    @call
    def health(self) -> dict:
        return (yield from self._json("GET", "/healthz"))

    @call
    def ready(self) -> dict:
        """``/readyz``'s body (also when not ready: ``status`` says so, no exception)."""
        r = yield from self._request("GET", "/readyz", ok=(503,), retry=False)
        try:
            return r.json()
        except ValueError:
            raise unexpected(r, "an answer that is not JSON") from None

    @call
    def info(self) -> dict:
        return (yield from self._json("GET", "/v1/info"))

    # --- spaces ---------------------------------------------------------------------------------
    @call
    def list_spaces(self) -> list[dict]:
        return (yield from self._pages("/v1/spaces"))

    @call
    def get_space(self, name: str) -> dict:
        return (yield from self._json("GET", f"/v1/spaces/{_seg(name)}"))

    @call
    def create_space(self, name: str, dim: int | None = None, *, encoder: str | None = None,
                     query_prefix: str = "", passage_prefix: str = "", description: str = "") -> dict:
        return (yield from self._json("POST", "/v1/spaces", json=clean({
            "name": name, "dim": dim, "encoder": encoder, "query_prefix": query_prefix,
            "passage_prefix": passage_prefix, "description": description})))

    @call
    def delete_space(self, name: str) -> dict:
        """Remove an unused space (409 while maps, steers or indexes are in it): the space as it was."""
        return (yield from self._json("DELETE", f"/v1/spaces/{_seg(name)}"))

    # --- maps -----------------------------------------------------------------------------------
    @call
    def list_maps(self) -> list[dict]:
        return (yield from self._pages("/v1/maps"))

    @call
    def get_map(self, ref: str) -> dict:
        """The map's summary and ``resolved``: the version ``ref`` (name, name@alias, name:N) names."""
        return (yield from self._json("GET", f"/v1/maps/{_seg(ref)}"))

    @call
    def list_versions(self, name: str, *, include_deleted: bool = True) -> list[dict]:
        return (yield from self._pages(f"/v1/maps/{_seg(name)}/versions", {"include_deleted": include_deleted}))

    @call
    def set_alias(self, name: str, alias: str, version: int, *, expected: int | None = None) -> dict:
        """Point ``name@alias`` at ``version``; ``expected``: only while it points there (0: unset), else 409."""
        return (yield from self._json("PUT", f"/v1/maps/{_seg(name)}/aliases/{_seg(alias)}", json=clean({
            "version": self._ver(version), "expected_version": self._expected(expected)})))

    @call
    def delete_alias(self, name: str, alias: str, *, expected: int | None = None) -> None:
        """Remove ``name@alias``; ``expected``: only while it points at that version, else 412."""
        yield from self._json("DELETE", f"/v1/maps/{_seg(name)}/aliases/{_seg(alias)}",
                              headers=alias_if_match(expected))

    @call
    def delete_version(self, name: str, version: int) -> dict:
        """Soft delete (kept for lineage, unresolvable); the answer's ``bare_ref``: what a bare ``name`` means now."""
        return (yield from self._json("DELETE", f"/v1/maps/{_seg(name)}/versions/{self._ver(version)}"))

    @call
    def download_artifact(self, ref: str, *, format: str = "safetensors") -> bytes:
        """The map artifact's bytes (``safetensors`` or ``npz``; ``align.map_from_bytes`` reads any kind of map)."""
        return (yield from APICalls.artifact(self, ref, format=format)).data

    @call
    def artifact(self, ref: str, *, format: str = "safetensors", etag: str | None = None) -> Artifact:
        """The map artifact (``data``) with its ``etag`` and ``version``. Pass the ``etag`` of a copy you hold:
        ``data`` is None while it is still what ``ref`` names (304, nothing downloaded)."""
        r = yield from self._request("GET", f"/v1/maps/{_seg(ref)}/artifact", params={"format": format}, ok=(304,),
                                     headers={"If-None-Match": etag} if etag else {})
        v = r.headers.get("x-map-version")
        return Artifact(None if r.status_code == 304 else r.content, r.headers.get("etag"), v and int(v))

    @call
    def transform(self, ref: str, X, *, output: str = "raw", binary: bool = True,
                  with_versions: bool = False) -> Any:  # np.ndarray, or (Y, versions) with_versions
        """Map rows ``X`` (n, d_source) through ``ref``; returns float32 (n, d_target).

        ``binary=True`` sends raw float32 (``application/octet-stream``) and reads raw float32 back (shape from
        ``X-Shape``); ``binary=False`` sends JSON (``vectors_b64``) instead, for proxies that pass only JSON.
        ``output``: ``raw`` (comparable with the target model's own vectors), ``frame`` or ``linear`` (see the
        route's documentation). Rows sent in several batches all go through the version the first batch used;
        ``with_versions=True`` returns ``(Y, ["name:version"])``, that version, to record beside the vectors."""
        A, pinned = matrix(X), [ref]
        used_by_first: list[str] = []

        def send(part: slice) -> np.ndarray:  # batches after the first go through the version it used
            Y, used = yield from self._transform(pinned[0], A[part], output, binary)
            pinned[0] = used or pinned[0]
            if used and not used_by_first:
                used_by_first.append(used)
            return Y

        parts = yield from self._batched(A.shape[0], 4 * A.shape[1] if binary else b64_row_bytes(A.shape[1]), send,
                                        body="binary" if binary else "json")
        Y = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return (Y, used_by_first) if with_versions else Y

    def _transform(self, ref: str, A: np.ndarray, output: str, binary: bool) -> tuple[np.ndarray, str | None]:
        """One transform request: ``(Y, "name:version" of the map version used, when the answer says)``."""
        if not binary:
            body = yield from self._json("POST", f"/v1/maps/{_seg(ref)}/transform", retry=True,
                                         json={**b64(A), "output": output, "encoding_format": "base64"})
            return rows(body), f"{body['map']}:{body['version']}" if "version" in body else None
        r = yield from self._request("POST", f"/v1/maps/{_seg(ref)}/transform", params={"output": output},
                                     content=A.tobytes(), retry=True,
                                     headers={"Content-Type": "application/octet-stream",
                                              "X-Vector-Dim": str(A.shape[1])})
        try:
            used = f"{r.headers['x-map']}:{r.headers['x-map-version']}" if "x-map-version" in r.headers else None
            return float32_rows(r.content, r.headers["x-shape"].split(",")), used
        except (KeyError, ValueError):
            raise unexpected(r, f"not {A.shape[0]} rows of float32 with their X-Shape") from None

    @call
    def transform_npy(self, ref: str, X, *, output: str = "raw") -> np.ndarray:
        """As :meth:`transform`, with ``.npy`` bodies both ways (float16/32/64 in, dtype kept self-described)."""
        buf = io.BytesIO()
        np.save(buf, np.asarray(X))
        r = yield from self._request("POST", f"/v1/maps/{_seg(ref)}/transform", params={"output": output},
                                     content=buf.getvalue(), headers={"Content-Type": "application/x-npy"}, retry=True)
        try:
            return np.load(io.BytesIO(r.content), allow_pickle=False)
        except (ValueError, OSError, EOFError):
            raise unexpected(r, "not a .npy array") from None

    @call
    def report(self, name: str, version: int) -> str:
        """The version's HTML fit report (self-contained; 404 when it has none)."""
        return (yield from self._request("GET", f"/v1/maps/{_seg(name)}/versions/{self._ver(version)}/report")).text

    # --- migration: plan and gate ---------------------------------------------------------------
    @call
    def plan(self, old, probe_source, probe_target, *, target_retention: float = 0.95, random_state: int | None = 0,
             queries=None, old_queries=None, relevant: Sequence[int] | None = None, k: int | None = None,
             keep: bool = False) -> dict:
        """``POST /v1/plans``: plan migrating the corpus ``old`` (n, d_old) from a paired probe (``probe_source``
        (p, d_old), ``probe_target`` (p, d_new), row i the same text); with labelled ``queries`` (q, d_new),
        ``old_queries`` (q, d_old) and each one's ``relevant`` probe row, their retention is predicted. Synchronous:
        seconds to a minute; raise ``timeout`` for big corpora. ``random_state``: as :meth:`fit`'s. ``k``:
        ``rows_to_embed`` for that many rows (``plan --k``), not the recommended K's. ``keep``: the recommendation
        reads the forecast for a migration that keeps its re-embedded rows (``plan --keep``)."""
        body = clean({"old": b64(old, "old"), "probe_source": b64(probe_source, "probe_source"),
                      "probe_target": b64(probe_target, "probe_target"), "target_retention": float(target_retention),
                      "random_state": random_state, "k": k, "keep": as_flag(keep, "keep") or None,
                      **labelled(queries, old_queries, relevant)})
        return (yield from self._json("POST", "/v1/plans", json=body, retry=True))

    @call
    def evaluate(self, ref: str, source, target, *, queries=None, relevant: Sequence[int] | None = None,
                 old_queries=None, side: str = "target", min_retention: float | None = None,
                 min_top1: float | None = None, csls: bool = False, csls_weight: float | None = None,
                 max_queries: int | None = None, random_state: int | None = None, old_corpus=None) -> dict:
        """``POST /v1/maps/{ref}/evaluate`` (``vecbridge eval``): the map on held-out pairs ``source`` (n, d_s) /
        ``target`` (n, d_t), and on labelled ``queries`` with each one's ``relevant`` row (``old_corpus``, the old
        model's vectors of the rest of the corpus, with ``old_queries``: their retention over the whole corpus,
        which the gate then reads); ``min_retention`` /
        ``min_top1`` add ``result`` ``PASS`` / ``FAIL`` (an answer, not an exception). Above ``max_queries`` pairs
        (the server's default 10,000) a sample of that many drawn with ``random_state`` is ranked against all n
        (``n_queries``, ``intervals`` in the answer)."""
        body = clean({"source": b64(source, "source"), "target": b64(target, "target"), "side": side,
                       "min_retention": min_retention, "min_top1": min_top1, "csls": as_flag(csls, "csls"),
                       "csls_weight": csls_weight, "max_queries": max_queries, "random_state": random_state,
                       **labelled(queries, old_queries, relevant)})
        if old_corpus is not None:
            body["old_corpus"] = b64(old_corpus, "old_corpus")
        return (yield from self._json("POST", f"/v1/maps/{_seg(ref)}/evaluate", json=body, retry=True))

    # --- indexes --------------------------------------------------------------------------------
    @call
    def list_indexes(self) -> list[dict]:
        return (yield from self._pages("/v1/indexes"))

    @call
    def get_index(self, name: str) -> dict:
        return (yield from self._json("GET", f"/v1/indexes/{_seg(name)}"))

    @call
    def create_index(self, name: str, space: str, vectors=None, *, texts: Sequence[str] | None = None,
                     ids: Sequence[int] | None = None, payloads: Sequence[Any] | None = None, kind: str = "auto",
                     metric: str = "cosine", params: dict | None = None, random_state: int | None = None,
                     description: str = "") -> dict:
        """Create a FAISS index in ``space``: empty, or ``vectors`` (n, d) or ``texts`` (seed: params' if None)."""
        body = clean({"name": name, "space": space, "kind": kind, "metric": metric, "params": params or {},
                       "random_state": random_state, "description": description, "texts": as_list(texts),
                       "ids": as_list(ids), "payloads": as_list(payloads)})
        if vectors is not None:
            body.update(b64(vectors))
        return (yield from self._json("POST", "/v1/indexes", json=body))

    @call
    def add(self, name: str, vectors=None, *, texts: Sequence[str] | None = None, ids: Sequence[int] | None = None,
            payloads: Sequence[Any] | None = None) -> dict:
        """Add rows (``vectors`` or ``texts``); returns ``{"index", "ids", "count", "notes"}`` (``notes``: what the
        rows check could not tell, e.g. rows added unchecked while the registry did not answer).

        More rows than one request may hold go in batches (``batch_size``): not one transaction; ``notes`` holds every
        batch's, each once. Whatever ends the call part-way carries ``added_ids``, the ids of the rows of the batches
        already answered (resume with the rows after them): an :class:`APIError` or :class:`APIConnectionError`, a
        Ctrl-C (the ``KeyboardInterrupt``, raised on with it and a note), a cancelled ``AsyncClient`` call (its
        ``CancelledError``). The batch in flight may be added too, unless an error answer refused it: re-add to tell."""
        A = None if vectors is None else matrix(vectors)
        texts, ids, payloads = as_list(texts), as_list(ids), as_list(payloads)
        n = len(A) if A is not None else len(texts or [])
        row = (0 if A is None else b64_row_bytes(A.shape[1])) + sum(
            json_sizes(x, n) for x in (texts, ids, payloads) if x is None or len(x) == n)
        added: list[int] = []

        def send(part: slice) -> dict:
            body = clean({"texts": cut(texts, part, n), "ids": cut(ids, part, n), "payloads": cut(payloads, part, n)})
            if A is not None:
                body.update(b64(A[part]))
            answer = yield from self._json("POST", f"/v1/indexes/{_seg(name)}/vectors", json=body)
            added.extend(answer["ids"])
            return answer

        try:
            answers = yield from self._batched(n, row, send)
        except BaseException as e:  # a Ctrl-C between batches lost which rows were in (only API errors said)
            partly_added(e, added)
            raise
        if len(answers) == 1:
            return answers[0]
        notes = list(dict.fromkeys(n for a in answers for n in a.get("notes", [])))  # the first batch's too
        return {**answers[-1], "ids": added, "notes": notes}

    @call
    def delete_ids(self, name: str, ids: Sequence[int]) -> dict:
        """Delete rows by id (unknown ids are ignored); returns ``{"index", "deleted", "count"}``. More ids than one
        request may hold go in batches (harmless to repeat: a batch again deletes nothing more)."""
        ids = as_ints(ids, "ids")  # int() sent 1.9 and True as id 1: the wrong row deleted

        def send(part: slice) -> dict:
            return (yield from self._json("POST", f"/v1/indexes/{_seg(name)}/delete", json={"ids": ids[part]},
                                          retry=True))

        answers = yield from self._batched(len(ids), json_sizes(ids, len(ids)), send, body="texts")
        return answers[0] if len(answers) == 1 else {**answers[-1], "deleted": sum(a["deleted"] for a in answers)}

    @call
    def drop_index(self, name: str) -> None:
        yield from self._json("DELETE", f"/v1/indexes/{_seg(name)}")

    @call
    def search(self, name: str, queries=None, *, texts: Sequence[str] | None = None, space: str | None = None,
               k: int = 10, map: str | Sequence[str] | None = None, steers: dict[str, float] | None = None,
               **options) -> dict:
        """Search index ``name`` with ``queries`` (n, d_space) or ``texts`` from any registered ``space``.

        Returns the route's answer: ``results`` (n lists of ``{"id", "score", "payload"}``) and ``maps`` (the map
        versions that carried every query into the index's space). ``map``: a map or a path (list) of maps to use.
        ``options``: ``csls``, ``csls_k``, ``csls_weight``, ``exact``, ``ef_search``, ``nprobe``,
        ``include_payloads``."""
        Q, texts = None if queries is None else matrix(queries, "queries"), as_list(texts)
        pin = {"map": map, "steers": steers}  # batches after the first: the versions it used (client_wire.pinned)

        def send(part: slice) -> dict:
            body = clean({"texts": cut(texts, part, n), "space": space, "k": k, **pin, **options})
            if Q is not None:
                body.update(b64(Q[part], "queries"))
            answer = yield from self._json("POST", f"/v1/indexes/{_seg(name)}/search", json=body, retry=True)
            pin.update(pinned(answer))
            return answer

        n = len(Q) if Q is not None else len(texts or [])
        row = b64_row_bytes(Q.shape[1]) if Q is not None else json_sizes(texts, n)
        answers = yield from self._batched(n, row, send, hits=k if isinstance(k, numbers.Integral) and k > 0 else 0)
        return answers[0] if len(answers) == 1 else {**answers[0], "results": [r for a in answers
                                                                               for r in a["results"]]}

    # --- fits and jobs --------------------------------------------------------------------------
    @call
    def fit(self, name: str, source_space: str, target_space: str, source, target, *, method: str | None = None,
            paired: bool | None = None, params: dict | None = None, seed_pairs: Sequence[tuple[int, int]] | None = None,
            random_state: int | None = 0, alias: str | None = None, description: str = "", encoder: str | None = None,
            idempotency_key: str | None = None, unpaired_source=None, unpaired_target=None) -> dict:
        """Queue a map fit; returns the job record at once (follow it with :meth:`wait`).

        ``source`` / ``target``: an array (n, d) or a list of texts (embedded in the job with ``encoder``, default
        each space's encoder). ``method`` None: the server's minivec2vec (``paired=True``: a 422 under 2 seed pairs).
        ``paired`` (row i <-> row i): default true for a paired method, false for minivec2vec. ``random_state``: sent
        as given (a 422 unless an integer 0 .. 2**31-1); None: the service's 0, not a fresh seed as in :mod:`align`.
        ``unpaired_source`` / ``unpaired_target``: arrays (k, d) of more rows of the source / target model beside the
        pairs (the old corpus, queries), sent as base64 float32: ``align.fit_migration``'s unpaired rows, for the
        methods auto, contrastive and cluster."""
        body = clean({"name": name, "source_space": source_space, "target_space": target_space,
                       "source": side(source, encoder), "target": side(target, encoder), "method": method,
                       "paired": paired, "params": params or {}, "random_state": random_state, "alias": alias,
                       "description": description, "seed_pairs": as_ints(seed_pairs, "seed_pairs", width=2),
                       **{k: b64(U, k) for k, U in (("unpaired_source", unpaired_source),
                                                    ("unpaired_target", unpaired_target)) if U is not None}})
        headers = {"Idempotency-Key": idempotency_key or new_key()}
        return (yield from self._json("POST", "/v1/fits", json=body, headers=headers))

    @call
    def migrate(self, source: str, target: str, map: str, *, alias: str | None = None, batch_size: int = 2000,
                pause: float = 0.0, overwrite: bool = False, source_space: str | None = None,
                target_space: str | None = None, dry_run: bool = False, idempotency_key: str | None = None,
                **fields) -> dict:
        """Queue a migration of a collection in the service's vector database through a registry map (``POST
        /v1/migrations``); returns the job record at once (:meth:`wait` for ``result["report"]``). ``fields``:
        ``index``, ``id_field``, ``vector_field``, ``text_field``."""
        body = clean({"source": source, "target": target, "map": map, "alias": alias, "batch_size": batch_size,
                      "pause": pause, "overwrite": overwrite, "source_space": source_space,
                      "target_space": target_space, "dry_run": dry_run, **fields})
        headers = {"Idempotency-Key": idempotency_key or new_key()}
        return (yield from self._json("POST", "/v1/migrations", json=body, headers=headers))

    @call
    def verify(self, collection: str, *, encoder: str | None = None, source: str | None = None,
               map: str | None = None, min_recall: float | None = None, idempotency_key: str | None = None,
               **options) -> dict:
        """Queue a check of a migrated collection (``POST /v1/verifications``); returns the job record at once
        (:meth:`wait`: figures and ``verdict``). ``options``: ``n_sample``, ``queries``, ``k``, ``random_state``,
        ``id_field``, ``vector_field``, ``text_field``, ``source_space``."""
        body = clean({"collection": collection, "encoder": encoder, "source": source, "map": map,
                      "min_recall": min_recall, **options})
        headers = {"Idempotency-Key": idempotency_key or new_key()}
        return (yield from self._json("POST", "/v1/verifications", json=body, headers=headers))

    @call
    def search_collection(self, name: str, queries=None, *, space: str, texts: Sequence[str] | None = None,
                          k: int = 10, map: str | Sequence[str] | None = None,
                          collection_space: str | None = None) -> dict:
        """Search a collection of the service's vector database with ``queries`` (n, d) or ``texts`` of ``space``,
        mapped into the collection's space (``POST /v1/collections/{name}/search``): ``results``, ``maps``."""
        body = clean({"space": space, "k": k, "map": map, "collection_space": collection_space,
                      "texts": as_list(texts), **({} if queries is None else b64(queries))})
        return (yield from self._json("POST", f"/v1/collections/{_seg(name)}/search", json=body, retry=True))

    @call
    def list_jobs(self, *, state: str | Sequence[str] | None = None, kind: str | Sequence[str] | None = None,
                  newest: bool = False) -> list[dict]:
        """Every job of the service's data dir (its pages followed), oldest first (``newest``: newest first); ``state``
        / ``kind``: only the jobs in those states / of those kinds (one name or several), as ``GET /v1/jobs``."""
        params: dict = {"order": "newest"} if newest else {}
        for key, value in (("state", state), ("kind", kind)):
            if value is not None:
                params[key] = [value] if isinstance(value, str) else list(value)
        return (yield from self._pages("/v1/jobs", params))

    @call
    def job_counts(self) -> dict[str, int]:
        """Jobs by state (every process of the service's data dir)."""
        return (yield from self._json("GET", "/v1/jobs", params={"limit": 1}))["counts"]

    @call
    def get_job(self, job_id: str) -> dict:
        return (yield from self._json("GET", f"/v1/jobs/{_seg(job_id)}"))

    @call
    def cancel(self, job_id: str) -> dict:
        """Ask for the job's cancellation (it stops at its next check); returns the record."""
        return (yield from self._json("DELETE", f"/v1/jobs/{_seg(job_id)}"))

    @call
    def wait(self, job_id: str, *, timeout: float | None = 600.0, poll: float = 0.2,
             progress: Callable[[dict], None] | None = None) -> dict:
        """Poll a job until it ends; returns its record on success.

        ``progress(job)`` is called whenever the state, stage or fraction changed (with :class:`AsyncClient`, an
        ``async def`` one is awaited; :class:`Client` refuses one). A failed job (also one a server restart
        interrupted) raises :class:`JobFailedError`, a cancelled one :class:`JobCancelledError`; past ``timeout``
        seconds, :class:`JobTimeoutError` (a ``TimeoutError``; the job keeps running: :meth:`cancel` stops it). The
        job lives on the server, so polls that get no answer or a 502 / 503 / 504 (a restart, a deploy) are tried
        again until ``timeout``; the last such error is raised then. ``timeout=None`` waits as long as it takes."""
        poll, timeout = self._wait_times(poll, timeout)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        last = job = None
        while True:
            try:
                job = yield from self._json("GET", f"/v1/jobs/{_seg(job_id)}")
            except (APIConnectionError, APIError) as e:
                if (isinstance(e, APIError) and not retriable(e)) or isinstance(e, ClientClosedError) \
                        or time.monotonic() >= deadline:
                    raise
                yield Sleep(max(0.0, min(max(poll, 1.0), deadline - time.monotonic())))
                continue
            p = job.get("progress") or {}
            seen = (job.get("state"), p.get("stage"), p.get("fraction"))
            if progress is not None and seen != last:
                shown = progress(job)
                if inspect.isawaitable(shown):
                    yield Await(shown)
            last = seen
            if job.get("state") == "succeeded":
                return job
            if job.get("state") == "failed":
                raise JobFailedError(job)
            if job.get("state") == "cancelled":
                raise JobCancelledError(job)
            if time.monotonic() >= deadline:
                raise JobTimeoutError(job, timeout)
            yield Sleep(max(0.0, min(poll, deadline - time.monotonic())))  # the last poll lands at the deadline


# --- the two clients: the same calls, run on httpx.Client or httpx.AsyncClient -----------------------
_PARAMETERS = """
    Parameters
    ----------
    base_url : str
        e.g. ``"http://127.0.0.1:8000"``.
    api_key : str, optional
        Sent as ``Authorization: Bearer <key>``; never in an error message. One an HTTP header cannot carry (a
        newline, as in a key read from a file unstripped) is :class:`~align.exceptions.InputError` here.
    timeout : float
        Seconds per request (fits run as jobs, so requests stay short); None: no limit.
    page_size : int
        ``limit`` the list methods ask for while following ``next`` cursors.
    max_retries : int
        Retries of a request that may be sent again (module docstring); 0 turns them off.
    max_retry_wait : float
        Longest ``Retry-After`` (seconds) the client waits out; a longer one raises at once.
    batch_size : int, optional
        Most rows per request of :meth:`transform`, :meth:`add`, :meth:`search`, :meth:`apply_steer`,
        :meth:`embed` and :meth:`delete_ids`. Without it the client reads the service's limits from
        ``/v1/info`` (once) before a call of over 1 MiB of rows or 10,000 search hits, or after a smaller one
        was refused as too large (413), and sends the rows in batches within them (:mod:`service.client_wire`):
        ``max_batch`` rows, the byte limit of the body (``max_body_bytes`` binary, ``limits.body_bytes_json``
        JSON, ``limits.body_bytes_texts`` texts), ``limits.max_hits`` queries x k; the answers joined in order
        (through the map and steer versions the first batch used, whatever aliases move meanwhile).
    transport : httpx transport, optional
        For tests (e.g. ``httpx.ASGITransport``); default: the network.
"""


class Client(APICalls, SyncDriven, driver="sync"):
    __doc__ = f"""Talks to one vecbridge service (blocking calls on ``httpx.Client``).
{_PARAMETERS}
    The client is a context manager; :meth:`close` releases its connections. :class:`AsyncClient` has the same
    methods as coroutines. A process forked after it was used (a ``fork`` process pool) gets connections of its
    own (not with a ``transport=`` of yours: its pool is shared, so make the client in each process); pickling (a
    ``spawn`` pool) and ``copy`` rebuild it from its settings, API key included.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 60.0, page_size: int = 500,
                 max_retries: int = 2, max_retry_wait: float = 60.0, transport: httpx.BaseTransport | None = None,
                 headers: dict | None = None, batch_size: int | None = None) -> None:
        self._setup(base_url, api_key, timeout=timeout, page_size=page_size, max_retries=max_retries,
                    max_retry_wait=max_retry_wait, batch_size=batch_size, headers=headers, transport=transport)


class AsyncClient(APICalls, AsyncDriven, driver="async"):
    __doc__ = f"""Talks to one vecbridge service from asyncio: every method of :class:`Client` as a coroutine, with
    the same arguments, answers, errors, retries (``asyncio.sleep`` between them), batches and pagination (one
    implementation runs both: :mod:`service.client_core`).
{_PARAMETERS}
    ``async with AsyncClient(...) as vb:`` closes its connections at the end (or ``await vb.close()``). Calls
    may run concurrently (``asyncio.gather``) on its connection pool. ``wait``'s ``progress`` may be a plain
    callable or an ``async def``. Encoding and decoding vectors (base64, numpy) runs in the event loop: for very
    large arrays, ``batch_size`` keeps each step short. Its connections belong to one event loop: used again
    after that loop ended (a second ``asyncio.run``), it opens new ones (:class:`service.client_core.AsyncDriven`).
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 60.0, page_size: int = 500,
                 max_retries: int = 2, max_retry_wait: float = 60.0,
                 transport: httpx.AsyncBaseTransport | None = None, headers: dict | None = None,
                 batch_size: int | None = None) -> None:
        self._setup(base_url, api_key, timeout=timeout, page_size=page_size, max_retries=max_retries,
                    max_retry_wait=max_retry_wait, batch_size=batch_size, headers=headers, transport=transport)
