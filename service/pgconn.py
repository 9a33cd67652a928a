"""What vecbridge gives ``psycopg.connect`` beside a PostgreSQL URL: a connect timeout, and settings of its own (a
registry's ``search_path`` and ``statement_timeout``) sent *with* the operator's options, never instead of them.

libpq reads ``options`` from the first place that gives it: the connect call's keyword, the URL, the entry of a
service file (``?service=`` or ``PGSERVICE``), the ``PGOPTIONS`` environment variable. A keyword replaces the
rest: the registry's search_path, passed so, dropped an operator's ``PGOPTIONS='-c lock_timeout=5s'`` (and an
``application_name``, a ``search_path``). :func:`pg_connect_options` puts the operator's options (what libpq would
have sent: :func:`operator_options`) first in its keyword, vecbridge's after them. Used by the registry
(:mod:`service.registry.db`), the migration checkpoint and the pgvector store (:mod:`service.vectordb`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from align.exceptions import InputError
from align.options import check_number

__all__ = ["PG_MAX_TIMEOUT_S", "check_statement_timeout", "operator_options", "option_settings",
           "pg_connect_options", "pg_target"]

#: PostgreSQL's longest ``statement_timeout`` (2^31 - 1 ms), in whole seconds: a longer one failed its ``SET``
PG_MAX_TIMEOUT_S = 2147483


def check_statement_timeout(seconds, name: str = "statement_timeout_s") -> float | None:
    """``seconds`` as a float (None as None: the caller's default) when :func:`align.options.check_number` takes it
    as a number from 0 (no limit) to :data:`PG_MAX_TIMEOUT_S`, else InputError naming ``name``: ``"30"`` was a
    TypeError from a comparison (the registry's: from ``round``), ``True`` a 1 s limit, NaN a ValueError."""
    if seconds is None:
        return None
    try:
        return check_number(name, seconds, 0, PG_MAX_TIMEOUT_S)
    except InputError:
        raise InputError(f"{name} must be 0 (no limit) to {PG_MAX_TIMEOUT_S} seconds (PostgreSQL's longest "
                         f"statement_timeout), got {seconds!r}") from None


def pg_connect_options(url: str, *settings: str, drop: tuple[str, ...] = ()) -> dict:
    """Keyword arguments for ``psycopg.connect(url, ...)``: ``connect_timeout`` (the registry's
    :data:`~service.registry.postgres.PG_CONNECT_TIMEOUT_S`) unless the URL, its service file entry or
    ``PGCONNECT_TIMEOUT`` (an integer libpq takes: an empty or bad one failed its parse) gives one (a host that
    accepts nothing, a partition, was an error only after the OS's ~2 min TCP timeout); with ``settings``
    (``"-c search_path=vb"``, ...), ``options``: :func:`operator_options`, then ``settings`` (a later ``-c`` of the
    same name wins). The settings named in ``drop`` (``search_path``: a registry's schema comes from its URL) are
    left out of ``PGOPTIONS``' and a service file's options, never of the URL's own. ``{}`` when the URL cannot be
    parsed (connecting says why)."""
    from .registry.postgres import PG_CONNECT_TIMEOUT_S

    try:
        from psycopg.conninfo import conninfo_to_dict

        given = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - psycopg.connect raises the same, with its callers' (redacted) handling
        return {}
    service = _service_entry(given)
    kw: dict = {}
    env_timeout = re.fullmatch(r"\s*[-+]?\d+\s*", os.environ.get("PGCONNECT_TIMEOUT", ""))
    if not ("connect_timeout" in given or env_timeout
            or (service is None and _service_name(given)) or "connect_timeout" in (service or {})):
        kw["connect_timeout"] = PG_CONNECT_TIMEOUT_S  # a service whose file is not found here: left to libpq too
    operator = operator_options(given, service)
    if "options" in given:  # the URL's own options are the caller's: a search_path there is its schema, kept
        drop = ()
    parsed = option_settings(operator)
    kept = [raw for name, raw in parsed if name not in drop]
    if settings or len(kept) < len(parsed):
        kw["options"] = " ".join([*kept, *settings])  # "": send nothing (libpq takes an empty value as given)
    return kw


#: the server's switches as its getopt string has them (``postgres.c``): a letter before ``:`` takes a value, the rest
#: of its word (``-S4MB``) or else the next word (``-S 4MB``); the others may be bundled (``-ec name=value`` is ``-e``
#: then ``-c name=value``). ``-c`` and ``-`` (``--name=value``) set the setting ``name``; ``o`` is older servers'.
_SWITCHES = "B:bC:c:D:d:EeFf:h:ijk:lN:nOo:Pp:r:S:sTt:v:W:-:"
_TAKES_VALUE = frozenset(re.findall(r"(.):", _SWITCHES))


def option_settings(options: str) -> list[tuple[str | None, str]]:
    """libpq's ``options`` read as the server reads them (split at white space, ``\\`` escaping, then its command
    line switches: :data:`_SWITCHES`) as ``(name, text)`` for each switch -- ``name`` the setting a ``-c name=value``,
    ``-cname=value`` or ``--name=value`` sets, lower case with ``-`` as ``_``; None for any other switch (``-e``,
    ``-S 4MB``) or word -- ``text`` each switch as written, bundled ones apart (``-ec x=1``: ``-e``, ``-c x=1``)."""
    words = re.findall(r"(?:\\.|\S)+", options or "")
    out: list[tuple[str | None, str]] = []
    i, switches = 0, True
    while i < len(words):
        word = words[i]
        i += 1
        if not switches or word == "--" or not re.match(r"-[^-]|--.", word):  # "--" ends the switches; a word
            switches = switches and word != "--"  # that is none makes the server refuse the connection
            out.append((None, word))
            continue
        chars = re.findall(r"\\.|.", word[1:])  # each as the server reads it: "\\x" is "x"
        for k, char in enumerate(chars):
            flag = char[-1]
            if flag not in _TAKES_VALUE:
                out.append((None, f"-{char}"))
                continue
            value, text = "".join(chars[k + 1:]), "-" + "".join(chars[k:])
            if not value and i < len(words):
                value, text = words[i], f"{text} {words[i]}"
                i += 1
            name, eq, _ = re.sub(r"\\(.)", r"\1", value).partition("=")
            out.append((name.lower().replace("-", "_") if flag in "c-" and eq else None, text))
            break
    return out


def pg_target(url: str) -> str:
    """Where ``url`` (a URL or a libpq conninfo string: ``host=db password=s3cr3t dbname=vb``) connects, as an
    error may name it: ``user@host:port/dbname`` from libpq's parse, never the password (:func:`safe_url` cannot
    hide one in a conninfo string); every password found in it (:func:`url_secrets`: a raw ``/`` in the user part
    made libpq read a piece as the port) is still ``***``. Unparsable: a URL as :func:`safe_url` shows it,
    redacted; a conninfo string not at all (a password in it is not found for sure: an unclosed quote, ``\\ ``)."""
    from .urls import redact, safe_url

    try:
        from psycopg.conninfo import conninfo_to_dict

        given = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - psycopg's ProgrammingError (a stray "%"), or no psycopg
        if re.match(r"postgres(?:ql)?://", url):
            return redact(safe_url(url), url)
        return "a connection string that cannot be parsed (not shown: it may hold a password)"
    user = f"{given['user']}@" if given.get("user") else ""
    port = f":{given['port']}" if given.get("port") else ""
    return redact(f"{user}{given.get('host') or given.get('hostaddr') or ''}{port}/{given.get('dbname') or ''}", url)


def operator_options(given: dict, service: dict | None = None) -> str:
    """The ``options`` libpq sends for a URL parsed as ``given`` (``conninfo_to_dict``) when the call gives none:
    the URL's, else its service file entry's (``service``: that entry, else read), else ``PGOPTIONS``; ``""``. An
    empty ``options=`` is one given (libpq sends nothing, never ``PGOPTIONS``)."""
    if "options" in given:  # an empty one too: libpq sends nothing then
        return given["options"]
    entry = (_service_entry(given) if service is None else service) or {}
    return entry["options"] if "options" in entry else os.environ.get("PGOPTIONS", "")


def _service_name(given: dict) -> str | None:
    return given.get("service") or os.environ.get("PGSERVICE") or None


def _service_entry(given: dict) -> dict | None:
    """The ``key=value`` lines of the URL's service (``?service=``, else ``PGSERVICE``) in the first file that has
    it, as libpq looks: ``PGSERVICEFILE`` (else ``~/.pg_service.conf``), then ``$PGSYSCONFDIR/pg_service.conf``;
    None without a service or where no file read here has it (libpq's built-in folder is not known here)."""
    name = _service_name(given)
    if not name:
        return None
    files = [Path(os.environ["PGSERVICEFILE"])] if os.environ.get("PGSERVICEFILE") else []
    if not files:
        try:
            files.append(Path.home() / ".pg_service.conf")
        except RuntimeError:  # no home folder
            pass
    if os.environ.get("PGSYSCONFDIR"):
        files.append(Path(os.environ["PGSYSCONFDIR"]) / "pg_service.conf")
    for file in files:
        try:
            lines = file.read_text(errors="replace").splitlines()
        except OSError:
            continue
        entry, inside = {}, False
        for line in map(str.strip, lines):
            if line.startswith("["):
                if inside:
                    break
                inside = line.rstrip("]")[1:] == name
            elif inside and "=" in line and not line.startswith("#"):
                key, _, value = line.partition("=")
                entry.setdefault(key.strip(), value.strip())  # a key given twice: libpq takes the first
        if inside or entry:
            return entry
    return None
