"""A map version's record and its tags, for :class:`service.client.Client` and ``AsyncClient`` (a mixin of sans-IO
generators, :mod:`service.client_core`: the same requests and retries as every other call), with the version's
``ETag``: a tag write sent with it (``etag=``) holds only while the version is as its client read it."""

from __future__ import annotations

from typing import Any

from align.exceptions import InputError

from .client_core import call
from .client_wire import seg as _seg

__all__ = ["TagCalls", "VersionRecord"]


class VersionRecord(dict):
    """A map version's record: the answer's JSON (a ``dict``), and ``etag``, the version's entity tag as that
    answer gave it. Pass it as ``etag=`` to :meth:`~TagCalls.set_tag` / :meth:`~TagCalls.delete_tag`: the write
    holds only while the version is still as read (else :class:`~service.client.PreconditionFailedError`, 412,
    nothing written), and their answer is the version after, with its new ``etag`` for the next write."""

    etag: str | None = None


def _record(r, body: Any) -> VersionRecord:
    out = VersionRecord(body)
    out.etag = r.headers.get("etag")
    return out


def _if_match(etag: str | None) -> dict:
    """The ``If-Match`` header of a tag write (none for None); :class:`InputError` before anything is sent for a
    value no header can carry."""
    if etag is None:
        return {}
    if not isinstance(etag, str) or not etag.strip() or any(not " " <= c <= "~" for c in etag):
        raise InputError(f"etag must be the version's ETag as read (the .etag of get_version or of a tag write, "
                         f"e.g. '\"3f2a...\"'), got {etag!r}")
    return {"If-Match": etag}


class TagCalls:
    """``GET /v1/maps/{name}/versions/{version}`` and its tags (``PUT`` / ``DELETE .../tags/{key}``)."""

    def _version_path(self, name: str, version: int) -> str:
        return f"/v1/maps/{_seg(name)}/versions/{self._ver(version)}"

    @call
    def get_version(self, name: str, version: int) -> VersionRecord:
        """The record of ``name:version``, with its ``.etag`` (the ``etag=`` of a guarded tag write)."""
        r = yield from self._request("GET", self._version_path(name, version))
        return _record(r, self._decoded(r))

    @call
    def set_tag(self, name: str, version: int, key: str, value: Any, *, etag: str | None = None) -> VersionRecord:
        """Set tag ``key`` of ``name:version``: the version after, with its new ``.etag``. Tags are text: a string is
        stored as sent, any other JSON value as its compact JSON. ``etag``: only while the version's ETag is that
        one (from :meth:`get_version` or an earlier tag write), else :class:`~service.client.PreconditionFailedError`
        and nothing written. A write retried after its answer was lost is then refused too (the ETag changed with
        it): read the version again and decide."""
        r = yield from self._request("PUT", f"{self._version_path(name, version)}/tags/{_seg(key)}",
                                     json={"value": value}, headers=_if_match(etag))
        return _record(r, self._decoded(r))

    @call
    def delete_tag(self, name: str, version: int, key: str, *, etag: str | None = None) -> VersionRecord:
        """Remove tag ``key`` of ``name:version``: the version after, with its new ``.etag`` (a tag that is not set:
        :class:`~service.client.NotFoundError` naming those that are); ``etag`` as for :meth:`set_tag`."""
        r = yield from self._request("DELETE", f"{self._version_path(name, version)}/tags/{_seg(key)}",
                                     headers=_if_match(etag))
        return _record(r, self._decoded(r))
