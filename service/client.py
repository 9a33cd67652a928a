"""A thin Python client for the vecbridge HTTP API (httpx + numpy; no server code imported).

>>> from service.client import Client                                          # doctest: +SKIP
>>> vb = Client("http://127.0.0.1:8000", api_key="change-me")
>>> Y = vb.transform("demo-minilm-e5", X)           # (n, 384) float32 in, (n, 384) float32 out
>>> job = vb.wait(vb.fit("a2b", "a", "b", Xa, Xb, method="procrustes", paired=True)["id"],
...               progress=lambda j: print(j["progress"]))
>>> vb.search("docs-e5", queries, space="minilm", k=5)["results"]

Every method is one request (list methods follow ``next`` cursors until the last page) and
returns the decoded JSON answer, or numpy arrays where the route carries vectors. Vectors go
out as base64 float32 inside JSON (``vectors_b64`` + ``dim``), and :meth:`Client.transform`
sends raw little-endian float32 (``application/octet-stream``) by default: no JSON numbers to
parse on either side. ``binary=False`` sends the same request as JSON.

Errors: a 4xx/5xx answer raises the :class:`APIError` subclass of its status, carrying the
server's ``{"error": {"type", "status", "message"}}`` and the ``X-Request-ID`` to quote in a
bug report::

    APIError (VecbridgeError)   any error answer: .status, .type, .message, .request_id, .body, .kind
     +-- BadRequestError             400
     +-- AuthenticationError         401  missing or unknown API key
     +-- PermissionDeniedError       403  the key lacks the route's scope
     +-- NotFoundError               404  unknown space, map, version, alias, index, job, steer
     +-- ConflictError               409  deleted version, taken name, reused idempotency key
     +-- PayloadTooLargeError        413  body or batch over the service's limits
     +-- UnsupportedMediaTypeError   415
     +-- ValidationError             422  shape, dimension, NaN/Inf, bad name or option
     +-- QueueFullError              429  .retry_after seconds
     +-- ServerError                 5xx
          +-- ServiceUnavailableError     503  registry or language model not ready
    JobError                    :meth:`Client.wait` on a job that failed or was cancelled: .job
     +-- JobFailedError
     +-- JobCancelledError

Network failures stay ``httpx.TransportError`` (connect, read timeout, ...), untouched.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import numpy as np

from align.exceptions import Cancelled, VecbridgeError

from .errors import HTTP_STATUS

__all__ = [
    "Client", "APIError", "BadRequestError", "AuthenticationError", "PermissionDeniedError", "NotFoundError",
    "ConflictError", "PayloadTooLargeError", "UnsupportedMediaTypeError", "ValidationError", "QueueFullError",
    "ServerError", "ServiceUnavailableError", "JobError", "JobFailedError", "JobCancelledError",
]

TERMINAL = ("succeeded", "failed", "cancelled")


# --- errors -------------------------------------------------------------------------------------
class APIError(VecbridgeError):
    """An error answer of the API (``kind``: the kind of the status, as in ``service.errors``).

    Attributes
    ----------
    status : int
        The HTTP status.
    type : str
        The server's error kind (its exception class, e.g. ``DimensionMismatchError``).
    message : str
        The server's message: what went wrong and how to fix it.
    request_id : str or None
        ``X-Request-ID`` of the failed request (the server logs it).
    body : dict
        The decoded error body (``{"error": {...}}``), or ``{}`` when it was not JSON.
    retry_after : float or None
        ``Retry-After`` seconds, when the answer had one (429).
    """

    def __init__(self, status: int, type: str, message: str, request_id: str | None, body: dict,
                 retry_after: float | None = None) -> None:
        self.status, self.type, self.message, self.request_id, self.body = status, type, message, request_id, body
        self.retry_after = retry_after
        rid = f" [request {request_id}]" if request_id else ""
        super().__init__(f"{status} {type}: {message}{rid}")


class BadRequestError(APIError):
    """400."""


class AuthenticationError(APIError):
    """401: no API key, or one the service does not know."""


class PermissionDeniedError(APIError):
    """403: the key lacks the scope (``read`` / ``write``) of the route."""


class NotFoundError(APIError):
    """404: unknown space, map, version, alias, index, job, steer or encoder."""


class ConflictError(APIError):
    """409: conflict with what is stored."""


class PayloadTooLargeError(APIError):
    """413: body over ``max_body_bytes`` or more rows than ``max_batch``."""


class UnsupportedMediaTypeError(APIError):
    """415."""


class ValidationError(APIError):
    """422: invalid input (shape, dimension, NaN/Inf, empty, bad name or option)."""


class QueueFullError(APIError):
    """429: the job queue is full; retry after :attr:`retry_after` seconds."""


class ServerError(APIError):
    """5xx."""


class ServiceUnavailableError(ServerError):
    """503: a part the route needs (registry, language model) is not ready."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError,
    409: ConflictError, 413: PayloadTooLargeError, 415: UnsupportedMediaTypeError, 422: ValidationError,
    429: QueueFullError, 503: ServiceUnavailableError,
}
_KIND_OF_STATUS = {status: kind for kind, status in reversed(HTTP_STATUS.items())} | {400: "invalid", 500: "internal"}
for _status, _cls in _BY_STATUS.items():  # each class's kind, as the service's one table says
    _cls.kind = _KIND_OF_STATUS[_status]


class JobError(VecbridgeError):
    """A job ended without success; :attr:`job` is its last record (``error`` says why)."""

    def __init__(self, job: dict) -> None:
        self.job = job
        err = job.get("error") or {}
        super().__init__(f"job {job.get('id')} {job.get('state')}: {err.get('type', '')} {err.get('message', '')}"
                         .rstrip())


class JobFailedError(JobError):
    """The job failed."""


class JobCancelledError(JobError, Cancelled):
    """The job was cancelled."""


def error_from_response(r: httpx.Response) -> APIError:
    """The :class:`APIError` subclass for an error answer ``r`` (status >= 400)."""
    try:
        body = r.json()
    except ValueError:
        body = {}
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        err = {"type": "HTTPError", "message": r.text[:500] or r.reason_phrase}
    cls = _BY_STATUS.get(r.status_code) or (ServerError if r.status_code >= 500 else APIError)
    try:
        retry_after = float(r.headers["retry-after"]) if "retry-after" in r.headers else None
    except ValueError:
        retry_after = None
    return cls(r.status_code, str(err.get("type", "HTTPError")), str(err.get("message", "")),
               r.headers.get("x-request-id"), body if isinstance(body, dict) else {}, retry_after)


# --- vectors on the wire ------------------------------------------------------------------------
def _matrix(X, name: str = "vectors") -> np.ndarray:
    """``X`` as C-contiguous little-endian float32 (n, d); a 1-D row becomes (1, d)."""
    A = np.asarray(X, dtype="<f4")
    if A.ndim == 1:
        A = A[None, :]
    if A.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array (n, d), got shape {A.shape}")
    return np.ascontiguousarray(A)


def _b64(X, name: str = "vectors") -> dict:
    """``{"vectors_b64": ..., "dim": d}``: the JSON fields of a matrix as base64 float32."""
    A = _matrix(X, name)
    return {"vectors_b64": base64.b64encode(A.tobytes()).decode("ascii"), "dim": int(A.shape[1])}


def _rows(body: dict) -> np.ndarray:
    """The vectors of a JSON answer (``vectors`` or ``vectors_b64`` with ``shape``) as float32 (n, d)."""
    if body.get("vectors_b64") is not None:
        return np.frombuffer(base64.b64decode(body["vectors_b64"]), dtype="<f4").reshape(body["shape"])
    return np.asarray(body["vectors"], dtype=np.float32)


def _clean(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


# --- the client ---------------------------------------------------------------------------------
class Client:
    """Talks to one vecbridge service.

    Parameters
    ----------
    base_url : str
        e.g. ``"http://127.0.0.1:8000"``.
    api_key : str, optional
        Sent as ``Authorization: Bearer <key>``.
    timeout : float
        Seconds per request (fits run as jobs, so requests stay short).
    page_size : int
        ``limit`` the list methods ask for while following ``next`` cursors.
    transport : httpx.BaseTransport, optional
        For tests (e.g. ``httpx.ASGITransport``); default: the network.

    The client is a context manager; :meth:`close` releases its connections.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 60.0, page_size: int = 500,
                 transport: httpx.BaseTransport | None = None, headers: dict | None = None) -> None:
        h = dict(headers or {})
        if api_key:
            h["Authorization"] = f"Bearer {api_key}"
        self.page_size = int(page_size)
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=h, timeout=timeout, transport=transport)

    # --- plumbing -------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, **kw) -> httpx.Response:
        """Send one request; an error answer raises its :class:`APIError` subclass."""
        r = self._http.request(method, path, **kw)
        if r.status_code >= 400:
            raise error_from_response(r)
        return r

    def _json(self, method: str, path: str, **kw) -> Any:
        r = self.request(method, path, **kw)
        return None if r.status_code == 204 or not r.content else r.json()

    def _pages(self, path: str, params: dict | None = None) -> Iterator[dict]:
        """Every item of a paginated list, page after page (``limit`` / ``cursor`` / ``next``)."""
        q = {**(params or {}), "limit": self.page_size}
        while True:
            body = self._json("GET", path, params=q)
            yield from body["data"]
            if not body.get("next"):
                return
            q["cursor"] = body["next"]

    # --- ops ------------------------------------------------------------------------------------
    def health(self) -> dict:
        return self._json("GET", "/healthz")

    def ready(self) -> dict:
        """``/readyz``'s body (also when not ready: ``status`` says so, no exception)."""
        r = self._http.get("/readyz")
        if r.status_code not in (200, 503):
            raise error_from_response(r)
        return r.json()

    def info(self) -> dict:
        return self._json("GET", "/v1/info")

    # --- spaces ---------------------------------------------------------------------------------
    def list_spaces(self) -> list[dict]:
        return list(self._pages("/v1/spaces"))

    def get_space(self, name: str) -> dict:
        return self._json("GET", f"/v1/spaces/{name}")

    def create_space(self, name: str, dim: int | None = None, *, encoder: str | None = None,
                     query_prefix: str = "", passage_prefix: str = "", description: str = "") -> dict:
        return self._json("POST", "/v1/spaces", json=_clean({
            "name": name, "dim": dim, "encoder": encoder, "query_prefix": query_prefix,
            "passage_prefix": passage_prefix, "description": description}))

    # --- maps -----------------------------------------------------------------------------------
    def list_maps(self) -> list[dict]:
        return list(self._pages("/v1/maps"))

    def get_map(self, ref: str) -> dict:
        """The map's summary and ``resolved``: the version ``ref`` (name, name@alias, name:N) names."""
        return self._json("GET", f"/v1/maps/{ref}")

    def list_versions(self, name: str, *, include_deleted: bool = True) -> list[dict]:
        return list(self._pages(f"/v1/maps/{name}/versions", {"include_deleted": include_deleted}))

    def get_version(self, name: str, version: int) -> dict:
        return self._json("GET", f"/v1/maps/{name}/versions/{int(version)}")

    def set_alias(self, name: str, alias: str, version: int) -> dict:
        return self._json("PUT", f"/v1/maps/{name}/aliases/{alias}", json={"version": int(version)})

    def delete_alias(self, name: str, alias: str) -> None:
        self._json("DELETE", f"/v1/maps/{name}/aliases/{alias}")

    def set_tag(self, name: str, version: int, key: str, value: Any) -> dict:
        return self._json("PUT", f"/v1/maps/{name}/versions/{int(version)}/tags/{key}", json={"value": value})

    def delete_version(self, name: str, version: int) -> dict:
        """Soft delete: the version stays for lineage but no reference resolves to it any more."""
        return self._json("DELETE", f"/v1/maps/{name}/versions/{int(version)}")

    def download_artifact(self, ref: str, *, format: str = "safetensors") -> bytes:
        """The map artifact's bytes (``safetensors`` or ``npz``; ``align.map_from_bytes`` reads any kind of map)."""
        return self.request("GET", f"/v1/maps/{ref}/artifact", params={"format": format}).content

    def transform(self, ref: str, X, *, output: str = "raw", binary: bool = True) -> np.ndarray:
        """Map rows ``X`` (n, d_source) through ``ref``; returns float32 (n, d_target).

        ``binary=True`` sends raw float32 (``application/octet-stream``) and reads raw float32
        back (shape from ``X-Shape``); ``binary=False`` sends JSON (``vectors_b64``) instead, for
        proxies that pass only JSON. ``output``: ``raw`` (comparable with the target model's own
        vectors), ``frame`` or ``linear`` (see the route's documentation).
        """
        A = _matrix(X)
        if not binary:
            body = self._json("POST", f"/v1/maps/{ref}/transform",
                              json={**_b64(A), "output": output, "encoding_format": "base64"})
            return _rows(body)
        r = self.request("POST", f"/v1/maps/{ref}/transform", params={"output": output}, content=A.tobytes(),
                         headers={"Content-Type": "application/octet-stream", "X-Vector-Dim": str(A.shape[1])})
        n, d = (int(v) for v in r.headers["x-shape"].split(","))
        return np.frombuffer(r.content, dtype="<f4").reshape(n, d)

    def transform_npy(self, ref: str, X, *, output: str = "raw") -> np.ndarray:
        """As :meth:`transform`, with ``.npy`` bodies both ways (float16/32/64 in, dtype kept self-described)."""
        buf = io.BytesIO()
        np.save(buf, np.asarray(X))
        r = self.request("POST", f"/v1/maps/{ref}/transform", params={"output": output}, content=buf.getvalue(),
                         headers={"Content-Type": "application/x-npy"})
        return np.load(io.BytesIO(r.content), allow_pickle=False)

    # --- indexes --------------------------------------------------------------------------------
    def list_indexes(self) -> list[dict]:
        return list(self._pages("/v1/indexes"))

    def get_index(self, name: str) -> dict:
        return self._json("GET", f"/v1/indexes/{name}")

    def create_index(self, name: str, space: str, vectors=None, *, texts: Sequence[str] | None = None,
                     ids: Sequence[int] | None = None, payloads: Sequence[Any] | None = None, kind: str = "auto",
                     metric: str = "cosine", params: dict | None = None, random_state: int = 0,
                     description: str = "") -> dict:
        """Create a FAISS index in ``space``, empty or filled with ``vectors`` (n, d) or ``texts``."""
        body = _clean({"name": name, "space": space, "kind": kind, "metric": metric, "params": params or {},
                       "random_state": random_state, "description": description, "texts": _list(texts),
                       "ids": _list(ids), "payloads": _list(payloads)})
        if vectors is not None:
            body.update(_b64(vectors))
        return self._json("POST", "/v1/indexes", json=body)

    def add(self, name: str, vectors=None, *, texts: Sequence[str] | None = None, ids: Sequence[int] | None = None,
            payloads: Sequence[Any] | None = None) -> dict:
        """Add rows (``vectors`` or ``texts``); returns ``{"index", "ids", "count"}``."""
        body = _clean({"texts": _list(texts), "ids": _list(ids), "payloads": _list(payloads)})
        if vectors is not None:
            body.update(_b64(vectors))
        return self._json("POST", f"/v1/indexes/{name}/vectors", json=body)

    def delete_ids(self, name: str, ids: Sequence[int]) -> dict:
        return self._json("POST", f"/v1/indexes/{name}/delete", json={"ids": [int(i) for i in ids]})

    def drop_index(self, name: str) -> None:
        self._json("DELETE", f"/v1/indexes/{name}")

    def search(self, name: str, queries=None, *, texts: Sequence[str] | None = None, space: str | None = None,
               k: int = 10, map: str | None = None, steers: dict[str, float] | None = None, **options) -> dict:
        """Search index ``name`` with ``queries`` (n, d_space) or ``texts`` from any registered ``space``.

        Returns the route's answer: ``results`` (n lists of ``{"id", "score", "payload"}``) and
        ``maps`` (the map versions that carried the queries into the index's space). ``options``:
        ``csls``, ``csls_k``, ``csls_weight``, ``exact``, ``ef_search``, ``nprobe``, ``include_payloads``.
        """
        body = _clean({"texts": _list(texts), "space": space, "k": k, "map": map, "steers": steers, **options})
        if queries is not None:
            body.update(_b64(queries, "queries"))
        return self._json("POST", f"/v1/indexes/{name}/search", json=body)

    # --- fits and jobs --------------------------------------------------------------------------
    def fit(self, name: str, source_space: str, target_space: str, source, target, *, method: str = "minivec2vec",
            paired: bool = False, params: dict | None = None, seed_pairs: Sequence[tuple[int, int]] | None = None,
            random_state: int = 0, alias: str | None = None, description: str = "",
            encoder: str | None = None, idempotency_key: str | None = None) -> dict:
        """Queue a map fit; returns the job record at once (follow it with :meth:`wait`).

        ``source`` / ``target``: an array (n, d) or a list of texts (embedded in the job with
        ``encoder``, default each space's encoder).
        """
        body = _clean({"name": name, "source_space": source_space, "target_space": target_space,
                       "source": _side(source, encoder), "target": _side(target, encoder), "method": method,
                       "paired": paired, "params": params or {}, "random_state": random_state, "alias": alias,
                       "description": description,
                       "seed_pairs": None if seed_pairs is None else [[int(a), int(b)] for a, b in seed_pairs]})
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._json("POST", "/v1/fits", json=body, headers=headers)

    def list_jobs(self) -> list[dict]:
        return list(self._pages("/v1/jobs"))

    def job_counts(self) -> dict[str, int]:
        """Jobs by state (every process of the service's data dir)."""
        return self._json("GET", "/v1/jobs", params={"limit": 1})["counts"]

    def get_job(self, job_id: str) -> dict:
        return self._json("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict:
        """Ask for the job's cancellation (it stops at its next check); returns the record."""
        return self._json("DELETE", f"/v1/jobs/{job_id}")

    def wait(self, job_id: str, *, timeout: float = 600.0, poll: float = 0.2,
             progress: Callable[[dict], None] | None = None) -> dict:
        """Poll a job until it ends; returns its record on success.

        ``progress(job)`` is called whenever the stage or fraction changed. A failed or cancelled
        job raises :class:`JobFailedError` / :class:`JobCancelledError`; past ``timeout`` seconds,
        :class:`TimeoutError` (the job keeps running: :meth:`cancel` stops it).
        """
        deadline = time.monotonic() + timeout
        last = None
        while True:
            job = self.get_job(job_id)
            seen = (job["state"], job["progress"]["stage"], job["progress"]["fraction"])
            if progress is not None and seen != last:
                progress(job)
            last = seen
            if job["state"] == "succeeded":
                return job
            if job["state"] == "failed":
                raise JobFailedError(job)
            if job["state"] == "cancelled":
                raise JobCancelledError(job)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job['state']} after {timeout:g} s")
            time.sleep(poll)

    # --- steers ---------------------------------------------------------------------------------
    def list_steers(self) -> list[dict]:
        return list(self._pages("/v1/steers"))

    def get_steer(self, ref: str) -> dict:
        return self._json("GET", f"/v1/steers/{ref}")

    def fit_steer(self, name: str, space: str, labels: Sequence[int], vectors=None, *,
                  texts: Sequence[str] | None = None, items: Sequence[str] | None = None, encoder: str | None = None,
                  params: dict | None = None, random_state: int = 0, alias: str | None = None,
                  description: str = "", idempotency_key: str | None = None) -> dict:
        """Queue a steer fit (rows ``vectors`` (n, d) or ``texts``, ``labels`` +1 / -1 / 0); returns the job."""
        body = _clean({"name": name, "space": space, "labels": [int(v) for v in labels], "texts": _list(texts),
                       "items": _list(items), "encoder": encoder, "params": params or {},
                       "random_state": random_state, "alias": alias, "description": description})
        if vectors is not None:
            body.update(_b64(vectors))
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._json("POST", "/v1/steers", json=body, headers=headers)

    def apply_steer(self, ref: str, X, *, eps: float = 1.0) -> np.ndarray:
        """``X (I + eps W)`` for rows ``X`` (n, d) of the steer's space; returns float32 (n, d)."""
        return _rows(self._json("POST", f"/v1/steers/{ref}/apply", json={**_b64(X), "eps": float(eps)}))

    def steer_lens(self, ref: str, *, k: int = 5, n_directions: int = 4) -> dict:
        return self._json("GET", f"/v1/steers/{ref}/lens", params={"k": k, "n_directions": n_directions})

    # --- language model (LM-Steer) --------------------------------------------------------------
    def lm_fit_steer(self, name: str, texts: Sequence[str], labels: Sequence[int], *, rank: int = 8,
                     eps: float = 1e-3, steps: int = 200, lr: float = 1e-2, random_state: int = 0,
                     alias: str | None = None, description: str = "", idempotency_key: str | None = None) -> dict:
        """Queue an LM-Steer fit on the service's language model; returns the job."""
        body = _clean({"name": name, "texts": list(texts), "labels": [int(v) for v in labels], "rank": rank,
                       "eps": eps, "steps": steps, "lr": lr, "random_state": random_state, "alias": alias,
                       "description": description})
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._json("POST", "/v1/lm/steers", json=body, headers=headers)

    def lm_generate(self, prompt: str, steers: dict[str, float] | None = None, *, max_new_tokens: int = 30,
                    temperature: float = 0.0, top_p: float = 0.9, random_state: int = 0) -> dict:
        """Continue ``prompt`` under ``{steer ref: eps}``; ``text`` is the continuation only."""
        return self._json("POST", "/v1/lm/generate", json={
            "prompt": prompt, "steers": steers or {}, "max_new_tokens": max_new_tokens,
            "temperature": temperature, "top_p": top_p, "random_state": random_state})

    def lm_analyze(self, text: str, steer: str, *, eps: float = 1.0, threshold: float = 0.5) -> dict:
        """Per-token evidence of ``steer`` in ``text`` (``tokens`` and ``spans``)."""
        return self._json("POST", "/v1/lm/analyze", json={"text": text, "steer": steer, "eps": eps,
                                                          "threshold": threshold})

    # --- embeddings -----------------------------------------------------------------------------
    def list_models(self) -> list[dict]:
        """Installed encoders (``GET /v1/models``)."""
        return self._json("GET", "/v1/models")["data"]

    def embed(self, texts: Sequence[str], model: str, *, target_space: str | None = None,
              input_type: str = "passage") -> np.ndarray:
        """Embed ``texts`` with an installed encoder (optionally translated into ``target_space``)."""
        body = self._json("POST", "/v1/embeddings", json=_clean({
            "input": list(texts), "model": model, "encoding_format": "base64", "target_space": target_space,
            "input_type": input_type}))
        return np.stack([np.frombuffer(base64.b64decode(e["embedding"]), dtype="<f4") for e in body["data"]])


def _list(x) -> list | None:
    return None if x is None else list(x)


def _side(x, encoder: str | None) -> dict:
    """One side of a fit body: texts (with the encoder) or base64 float32 vectors."""
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, str) for t in x):
        return _clean({"texts": list(x), "encoder": encoder})
    return _b64(x)
