"""FastAPI dependencies: settings, app state, API-key auth with ``read`` / ``write`` scopes.

Settings: :func:`current_settings` (:func:`service.config.app_settings`, shared with the console) — an override of :func:`service.config.get_settings` in
``app.dependency_overrides`` (tests), else the ``Settings`` given to :func:`create_app`, else
``VECBRIDGE_*`` variables. ``create_app`` keeps explicit settings on ``app.state`` rather than as a
dependency override: with any override present FastAPI re-analyses every dependency's signature
on every request (about 0.4 ms a request).

Every dependency here is ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in the
thread pool, one thread hop (0.1-0.3 ms on a busy machine) per dependency per request, for work
of a few microseconds.

Auth: ``Authorization: Bearer <key>``; keys and their scopes come from ``Settings.api_keys``
(``{"key": ["read", "write"]}``), or from the file ``VECBRIDGE_API_KEYS_FILE`` names, re-read when it changes
(:mod:`service.api.keyfile`). Scopes are explicit: a ``write``-only key cannot read.
Every configured key is compared in constant time (``hmac.compare_digest`` on BLAKE2b digests,
so neither the content nor the length of a key leaks through timing), keys are never logged,
and an empty key table refuses everything unless ``auth_disabled=True`` was set on purpose.
Missing or unknown key: 401; known key without the route's scope: 403.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator

from ..config import Settings, app_settings as current_settings
from ..registry.names import MAX_VERSION, parse_version
from .codec import require_json
from .keyfile import current_keys
from ..errors import AuthenticationError, PermissionDeniedError, ServiceUnavailableError
from ..ops.jobs import per_key_limit
from .state import AppState

__all__ = ["current_settings", "SettingsDep", "StateDep", "require_scope", "authorize", "ReadScope", "WriteScope", "JSONOnly", "SCOPES",
           "MetricsAccess", "VersionPath", "job_owner",
           "jobs_per_key"]

SCOPES = ("read", "write")
_bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer <key>`")


async def app_settings(request: Request) -> Settings:
    return current_settings(request.app)


SettingsDep = Annotated[Settings, Depends(app_settings)]


async def get_state(request: Request) -> AppState:
    state = getattr(request.app.state, "vb", None)
    if state is None or state.registry is None:
        raise ServiceUnavailableError("the service is starting or its registry is unavailable; see /readyz")
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def _version_segment(text):
    return parse_version(text, f"version {text[:40]!r}") if isinstance(text, str) else text


#: a ``{version}`` path segment: ASCII digits, 1 .. 2**31-1 (the registry's INTEGER column), read by the registry's
#: one strict parser; else a 422, never a 500. A plain ``int`` took '1_0' as 10 ("no version 10"), and '1.0', '+1'
#: and ' 1' as 1
VersionPath = Annotated[int, Path(ge=1, le=MAX_VERSION, description="Version number (1 .. 2**31-1)."),
                        BeforeValidator(_version_segment)]  # Path first: OpenAPI keeps minimum / maximum


def _digest(s: str) -> bytes:
    """SHA-256 of a key: a job's owner (:func:`job_owner`, kept in the job records)."""
    return hashlib.sha256(s.encode("utf-8")).digest()


def _probe(s: str) -> bytes:
    """The digest keys are compared by (:func:`scopes_for_token`): BLAKE2b, CPython's own, where OpenSSL's SHA-256
    (its algorithm fetched per call) cost ~10 µs of each request in the server, twice. Never stored."""
    return hashlib.blake2b(s.encode("utf-8"), digest_size=32).digest()


_KEY_PROBES: tuple = (None, None, ())  # (keys dict, a copy of it, ((_probe(key), scopes), ...)): the last keys seen


def _key_probes(keys: dict[str, list[str]]) -> tuple:
    """``((_probe(key), scopes), ...)`` of ``keys``, made once per key table (the settings', or a keys file's latest
    read), not once per request; a table changed in place is read again."""
    global _KEY_PROBES
    held, copy, probes = _KEY_PROBES
    if held is keys and copy == keys:
        return probes
    probes = tuple((_probe(key), scopes) for key, scopes in keys.items())
    _KEY_PROBES = (keys, {key: list(scopes) for key, scopes in keys.items()}, probes)
    return probes


def scopes_for_token(token: str, keys: dict[str, list[str]]) -> list[str] | None:
    """Scopes of the key equal to ``token``, or None; compares against every key in constant time."""
    probe = _probe(token)
    found: list[str] | None = None
    for digest, scopes in _key_probes(keys):
        if hmac.compare_digest(probe, digest) and found is None:
            found = list(scopes)
    return found


def require_scope(scope: str):
    """Dependency factory: the request must carry a key with ``scope`` (unless auth is disabled)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    async def check(request: Request, settings: SettingsDep,
              creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str | None:
        return authorize(request.headers.get("authorization"), scope, settings)

    check.__name__ = f"require_{scope}"
    check.vb_scope = scope  # read by the guard middleware, which checks the key before the body is read
    return check


def authorize(authorization: str | None, scope: str, settings: Settings) -> str | None:
    """The one key check: raises AuthenticationError (401) or PermissionDeniedError (403).

    ``authorization`` is the raw ``Authorization`` header. Called by the route dependency and,
    before any body byte is read, by :class:`service.api.middleware.GuardMiddleware`.
    """
    if settings.auth_disabled:
        return None
    kind, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    if kind.lower() != "bearer" or not token:
        if authorization:
            raise AuthenticationError("unsupported Authorization header; use 'Authorization: Bearer <key>'"
                                      + _key_file_hint(settings))
        raise AuthenticationError("missing API key: send the header 'Authorization: Bearer <key>'"
                                  + _key_file_hint(settings))
    scopes = scopes_for_token(token, current_keys(settings))
    if scopes is None:
        raise AuthenticationError("invalid API key" + _key_file_hint(settings))
    if scope not in scopes:
        raise PermissionDeniedError(f"this API key lacks the {scope!r} scope needed here (it has {sorted(scopes)})")
    return scope


def _key_file_hint(settings: Settings) -> str:
    """Where the key is when the service made it (``<data_dir>/local-key``, no keys configured): a user of
    ``make run`` was told to send a key and not where it was. The path only, never the key."""
    path = settings.local_key_file
    return "" if path is None else f" (no API keys are configured: this service's key is in the file {path})"


def jobs_per_key(settings: Settings) -> int | None:
    """How many jobs one key may have waiting (:func:`service.ops.jobs.per_key_limit` of ``max_queued_jobs_per_key``
    and the keys with the write scope now: the key file is re-read when it changes); None: no bound of its own."""
    keys = {} if settings.auth_disabled else current_keys(settings)
    writers = sum("write" in scopes for scopes in keys.values())
    return per_key_limit(settings.max_queued_jobs_per_key, settings.max_queued_jobs, writers)


def job_owner(authorization: str | None, settings: Settings) -> tuple[str, int | None]:
    """Who queues a job (an already authorized request's ``Authorization`` header): a digest of its key, never the
    key; with auth off every caller is one owner. And how many jobs that owner may have waiting
    (:func:`jobs_per_key`)."""
    limit = jobs_per_key(settings)
    if settings.auth_disabled:
        return "*", limit
    token = (authorization or "").strip().partition(" ")[2].strip()
    return _digest(token).hex()[:32], limit


async def _metrics_access(request: Request, settings: SettingsDep,
                         creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """``/metrics`` per ``Settings.metrics_access``: open, a key with ``read``, or off (404). ``creds`` (unused: the
    key is checked below) declares the bearer key in the OpenAPI document, as every keyed route does; the document's
    finishing pass keeps it only where a key is needed (:func:`service.api.document.finish_document`)."""
    if settings.metrics_access == "off":
        from starlette.exceptions import HTTPException

        raise HTTPException(404, "metrics are turned off (metrics_access=off)")
    if settings.metrics_access == "key":
        authorize(request.headers.get("authorization"), "read", settings)


MetricsAccess = Depends(_metrics_access)


ReadScope = Depends(require_scope("read"))
WriteScope = Depends(require_scope("write"))


async def _json_only(request: Request) -> None:
    require_json(request.headers.get("content-type"))


# Routes whose body is JSON only (everything but transform): another Content-Type is a 415.
# List it after the scope dependency, so an unauthenticated request is a 401 first.
JSONOnly = Depends(_json_only)
