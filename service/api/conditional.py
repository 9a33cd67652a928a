"""HTTP conditional requests (RFC 9110 sections 8.8.3 and 13), written once for every route that has them.

**Reads** carry a strong ``ETag`` and ``Cache-Control``:

- a map artifact (``GET /v1/maps/{ref}/artifact``): ``"<artifact sha256>.<format>"``, known from the registry
  record before the artifact is read, so a 304 reads and serialises nothing (the bytes of a format are a
  function of the artifact: numpy's npz writer stamps every member 1980-01-01, not the clock). ``name:N`` names
  bytes that never change: ``private, max-age=31536000, immutable``; an alias or a bare name may move:
  ``private, no-cache`` (store it, revalidate each use);
- a JSON record (map, version, steer) and the fit report: the first 32 hex digits of the SHA-256 of the exact
  body, so anything that changes the body (a tag, an alias, a soft delete) changes the tag; ``private, no-cache``;
- an alias (``GET .../aliases/{alias}``): ``"v<N>"``, the version it points at (its whole representation).

``If-None-Match`` (``*`` or a list; weak comparison, 13.1.2) that matches → 304 with the ``ETag`` and no body.

**Alias writes** (``PUT`` / ``DELETE .../aliases/{alias}``, maps and steers): ``If-Match`` (a list of
``"v<N>"``, strong comparison; ``*``: the alias must be set) and ``If-None-Match: *`` (``PUT`` only: create it,
never move it) become the registry's compare-and-set (``expected=``): one conditional SQL statement, so there is
no check-then-write race between requests, processes or replicas sharing a PostgreSQL registry. When it does not
hold: 412 ``PreconditionFailedError`` naming where the alias points and its ETag; nothing changed. An alias that
is not set fails ``If-Match`` (412); an unknown map or version stays a 404. Answers of alias reads and writes
carry the alias's (new) ``ETag``, so a deploy script can chain guarded moves.

**Tag writes** (``PUT`` / ``DELETE /v1/maps/{name}/versions/{version}/tags/{key}``): ``If-Match`` (the version's
``ETag`` from ``GET`` of the version or an earlier tag write, strong comparison; ``*``: the version exists) is checked
on the version as it is inside the write's transaction (its row locked: tag writes of a version run one after the
other), so a tag write never overwrites a change its client did not see; when it does not hold: 412, nothing
written. The answer carries the version's new ``ETag``.

``If-Match`` and ``If-None-Match`` sent on several lines are one list (RFC 9110 5.3): every line counts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from starlette.responses import Response

from align.exceptions import InputError

from ..errors import PreconditionFailedError
from ..registry import AliasMovedError
from .responses import FastJSONResponse, dumps
from .schemas import MAX_VERSION, error_responses

__all__ = ["IMMUTABLE", "REVALIDATE", "IfMatch", "IfMatchVersion", "IfNoneMatch", "IfNoneMatchStar", "alias_answer",
           "alias_etag", "alias_write", "answer", "body_etag", "entity_tags", "not_modified", "read_responses",
           "record_etag", "version_check", "write_responses"]

IMMUTABLE = "private, max-age=31536000, immutable"
REVALIDATE = "private, no-cache"


def _every_line(name: str, description: str):
    """The type of request header ``name`` read whole: a client (or a proxy) may send it on several lines, which
    RFC 9110 5.3 reads as one comma-separated list, but FastAPI's ``Header()`` of a ``str`` hands the route only the
    first line (``If-Match: "v1"`` and ``If-Match: "v2"``: a write while the alias is at v2 was a 412). The header
    stays declared as the one string it is; the value is every line, joined with ``, ``."""

    def every_line(request: Request, value=None) -> str | None:
        return None if value is None else ", ".join(request.headers.getlist(name))

    # the header as declared (not a string annotation, which this module's `annotations` import would make of it)
    every_line.__annotations__["value"] = Annotated[str | None, Header(alias=name, description=description)]
    return Annotated[str | None, Depends(every_line)]


IfNoneMatch = _every_line("if-none-match", (
    "Entity tags (or `*`) the client holds: if one matches the current `ETag` (weak comparison) the answer is "
    "304 Not Modified with no body."))
IfNoneMatchStar = _every_line("if-none-match", "`*` only: create the alias, never move it (412 when it is set).")
IfMatch = _every_line("if-match", (
    "Write only while the alias's `ETag` (`\"v<N>\"`: the version it points at, from `GET`/`PUT` of the alias) "
    "is one of these, or `*` while it is set at all; else 412 and nothing changes. Atomic (compare-and-set)."))

IfMatchVersion = _every_line("if-match", (
    "Write only while the version's `ETag` (from `GET` of the version, or an earlier tag write's answer) is one of "
    "these (strong comparison), or `*`; else 412 and nothing changes. Checked in the write's transaction."))

_TAG = re.compile(r'\s*(W/)?"([^"]*)"\s*(?:,|$)')
_ALIAS_TAG = re.compile(r"v([1-9][0-9]{0,9})")
_ETAG_HEADER = {"ETag": {"description": "Strong entity tag of this answer (send it back in `If-None-Match`).",
                         "schema": {"type": "string"}},
                "Cache-Control": {"description": "How long a copy may be used without asking again.",
                                  "schema": {"type": "string"}}}


def read_responses(ok: dict | None = None, headers: dict | None = None) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of a read with an ``ETag``: the 200 (``ok`` merged in) documents the headers (and
    ``headers``, the route's own, which its 304 carries too), and the 304 (no body)."""
    both = {**_ETAG_HEADER, **(headers or {})}
    return {200: {**(ok or {}), "headers": both},
            304: {"description": "Not Modified: `If-None-Match` matched the current `ETag`; no body.", "headers": both}}


def write_responses(what: str = "alias") -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of a conditional write of ``what`` (an alias, a version's tag): the 200 carries its new
    ``ETag``, and the 412."""
    return {200: {"headers": {"ETag": {**_ETAG_HEADER["ETag"], "description": f"The {what}'s new entity tag."}}},
            **error_responses(412)}


def entity_tags(value: str) -> str | list[tuple[bool, str]]:
    """``"*"``, or the ``(weak, opaque)`` pairs of an ``If-Match`` / ``If-None-Match`` value (RFC 9110 8.8.3:
    ``W/"x", "y"``); what does not parse as an entity tag is skipped (it matches nothing)."""
    if value.strip() == "*":
        return "*"
    return [(bool(m.group(1)), m.group(2)) for m in _TAG.finditer(value)]


def body_etag(body: bytes) -> str:
    """The strong ETag of exactly these bytes: ``"<first 32 hex digits of their SHA-256>"``."""
    return f'"{hashlib.sha256(body).hexdigest()[:32]}"'


def record_etag(record) -> str:
    """The ``ETag`` ``GET`` of a registry record (a version) answers with: :func:`body_etag` of its JSON body."""
    return body_etag(dumps(record.to_dict()))


def version_check(if_match: str | None, name: str, version: int) -> Callable[[Any], None] | None:
    """The precondition of a tag write under ``If-Match`` (None without one): a check of the version's record, run
    by the registry in the write's transaction, raising :class:`~service.errors.PreconditionFailedError` (412) when
    the version's ETag is not one the header lists (``*``: any)."""
    if if_match is None:
        return None
    tags = entity_tags(if_match)

    def check(record) -> None:
        etag = record_etag(record)
        if tags != "*" and not any(not weak and opaque == etag.strip('"') for weak, opaque in tags):
            raise PreconditionFailedError(f"{name}:{version} has ETag {etag}, so If-Match: {if_match[:200]} does not "
                                          "hold: nothing changed (read it again and decide)")

    return check


def alias_etag(version: int) -> str:
    """The ETag of an alias pointing at ``version``: ``"v<N>"``."""
    return f'"v{int(version)}"'


def not_modified(if_none_match: str | None, etag: str, cache_control: str = REVALIDATE,
                 headers: dict | None = None) -> Response | None:
    """A 304 (``ETag``, ``Cache-Control`` and ``headers``, no body) when ``If-None-Match`` is ``*`` or lists a tag
    whose opaque part equals ``etag``'s (weak comparison, RFC 9110 13.1.2); else None: answer in full."""
    if if_none_match is None:
        return None
    tags = entity_tags(if_none_match)
    if tags != "*" and all(opaque != etag.strip('"') for _, opaque in tags):
        return None
    return Response(status_code=304, headers={"ETag": etag, "Cache-Control": cache_control, **(headers or {})})


def answer(if_none_match: str | None, response: Response, *, etag: str | None = None,
           cache_control: str = REVALIDATE) -> Response:
    """``response`` with its ``ETag`` (default: :func:`body_etag` of its body) and ``Cache-Control``, or the 304
    of :func:`not_modified`."""
    etag = etag or body_etag(response.body)
    hit = not_modified(if_none_match, etag, cache_control)
    if hit is not None:
        return hit
    response.headers["ETag"] = etag
    response.headers["Cache-Control"] = cache_control
    return response


def alias_answer(version: int, body: dict, if_none_match: str | None = None) -> Response:
    """The JSON answer ``body`` of an alias read or write with the ETag of the alias pointing at ``version``
    (:func:`alias_etag`), or a 304 when ``If-None-Match`` matches it."""
    return answer(if_none_match, FastJSONResponse(body), etag=alias_etag(version))


def _expected(if_match: str | None, if_none_match: str | None, body_expected: int | None):
    """``(expected, from_headers)`` for the registry's compare-and-set (see the module docstring)."""
    if if_match is None and if_none_match is None:
        return body_expected, False
    if body_expected is not None:
        raise InputError("give expected_version in the body or If-Match / If-None-Match, not both")
    if if_match is not None and if_none_match is not None:
        raise InputError("give If-Match or If-None-Match on an alias write, not both")
    if if_none_match is not None:
        if entity_tags(if_none_match) != "*":
            raise InputError("If-None-Match on an alias write takes only `*` (create it only while it is not set)")
        return 0, True
    tags = entity_tags(if_match)
    if tags == "*":
        return "*", True
    versions = [int(m.group(1)) for weak, opaque in tags if not weak and (m := _ALIAS_TAG.fullmatch(opaque))]
    return [v for v in versions if v <= MAX_VERSION], True  # none left: matches nothing (412)


def alias_write(call: Callable[[Any], Any], *, name: str, alias: str, if_match: str | None,
                if_none_match: str | None, body_expected: int | None = None) -> Any:
    """``call(expected)`` (a registry alias write taking ``expected=``) under the request's precondition headers
    or the body's ``expected_version`` (409 when that does not hold, as before); a header precondition that does
    not hold is a :class:`~service.errors.PreconditionFailedError` (412). Blocking: run it in a thread."""
    expected, from_headers = _expected(if_match, if_none_match, body_expected)
    try:
        return call(expected)
    except AliasMovedError as exc:
        if not from_headers:
            raise
        where = "is not set" if exc.current is None else \
            f"points at version {exc.current} (ETag {alias_etag(exc.current)})"
        sent = f"If-Match: {if_match}" if if_match is not None else f"If-None-Match: {if_none_match}"
        raise PreconditionFailedError(f"{name}@{alias} {where}, so {sent} does not hold: nothing changed (read it "
                                      f"again and decide)") from None
