"""Database URLs in messages: what an error may show of one (never its password), for the registry and the vector
databases alike.

A password is written in a URL's user part (``scheme://user:PASSWORD@host``) or, for libpq, a ``password=``
parameter. libpq ends the user part at the *first* ``@`` (Python's ``urlsplit`` at the last): a password with an
unescaped ``@`` (``S3C@RET``) made libpq connect to the host ``RET@127.0.0.1`` and quote it in its error, which
reached ``/readyz``, the logs and the CLI. :func:`check_pg_userinfo` refuses such a URL before libpq reads it, and
:func:`redact` also hides each piece of a password after an ``@`` where it is followed by one.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from align.exceptions import InputError

__all__ = ["check_pg_userinfo", "hide_endpoints", "redact", "safe_url", "url_secrets"]


#: where a URL's query parameter starts: its separator and name as written
_PARAM_NAME = re.compile(r"([?&])([^=&#?]*)=")
#: libpq's ``password=`` in a conninfo string (``host=db password=s3cr3t``): the value bare or single-quoted
_KW_SECRET = re.compile(r"(?:^|\s)(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'|(?:\\.|[^\s\\])+)", re.IGNORECASE)


def _secret_param(name: str) -> bool:
    """Whether a query parameter named ``name`` (as written) is a password: ``password`` or ``sslpassword`` (libpq
    takes both: the second unlocks the client key), in any case and percent-encoded too (``pass%77ord``: libpq
    decodes names as it does values, so it was sent as the password and shown as written)."""
    return unquote(name).lower() in ("password", "sslpassword")


def _params(url: str):
    """Each query parameter of ``url`` as ``(start, end, separator, name, value)``, as written. A password's value
    runs to the next ``&`` (libpq takes a ``?`` or ``#`` in it as part of it: ``password=s3?cr#3t``); any other's
    stops at a ``?`` or ``#`` too, so a ``?password=`` inside another parameter's value (which libpq may quote in
    its error) is found as well."""
    pos = 0
    while (m := _PARAM_NAME.search(url, pos)) is not None:
        secret = _secret_param(m[2])
        end = re.compile(r"&" if secret else r"[&#?]").search(url, m.end())
        end = len(url) if end is None else end.start()
        yield m.start(), end, m[1], m[2], url[m.end():end]
        pos = end


#: a URL (not a libpq conninfo string, whose values may hold a ``://``: ``application_name=http://x``) starts so
_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")


def _userinfo(url: str) -> tuple[str, str, int] | None:
    """``url`` up to its password's ``:``, the password and where its closing ``@`` ends; None without one. The user
    part runs to the *last* ``@``: libpq ends it at the first ``@`` before a ``/``, but a raw ``@``, ``/``, ``?`` or
    ``=`` in a password (``vb:p@ss?w=rd@db/vb``, ``vb:k9/Qz?x=7Lm@db/vb``) makes any later ``@`` its end as well as
    an ``@`` in a query parameter (``vb:p@db?application_name=a@b``): which one a person meant cannot be told, so the
    host and the query before the last ``@`` are hidden too, rather than a piece of a password shown. The password
    starts after the user part's first ``:``, so a raw ``@`` in the user name (``alice@corp:pw@db``) hides it too.
    Linear: one scan each way."""
    if (scheme := _SCHEME.match(url)) is None or _no_userinfo(url, scheme.end()):
        return None
    at = url.rfind("@", scheme.end())
    colon = url.find(":", scheme.end(), max(at, 0))
    if at < 0 or colon < 0:
        return None
    return url[:colon], url[colon + 1:at], at + 1


#: an authority with no user part: hosts (a bracketed IPv6 one too) each with an optional all-digit port
_HOST = r"(?:\[[0-9A-Fa-f:.%]*\]|[^@\[\]:,/?]*)(?::[0-9]+)?"
_PLAIN_AUTHORITY = re.compile(rf"{_HOST}(?:,{_HOST})*")


def _no_userinfo(url: str, start: int) -> bool:
    """Whether ``url`` surely has no user part: its authority (to the first ``/``) is hosts with numeric
    ports, no ``@`` comes before its query, and libpq parses the whole URL
    (``pg.example.com:5432/vb?user=alice@corp`` was shown as ``pg.example.com:***@corp``). A password with a ``/``
    (``vb:k9/Qz?x=7Lm@db``) leaves a port that is not a number, and one like ``vb:5432/x?y=z@db`` an unknown query
    parameter that libpq refuses: both are hidden as before. Left: ``vb:5432/x?application_name=y@db`` (a password
    of digits, a ``/`` and a known parameter's name) reads as a URL with no password, as libpq reads it."""
    end = url.find("/", start)  # libpq looks for the user part's "@" up to the first "/" ("?" does not end it)
    query = url.find("?", start)
    if "@" in url[start:len(url) if query < 0 else query] or _PLAIN_AUTHORITY.fullmatch(
            url, start, len(url) if end < 0 else end) is None:
        return False
    try:
        from psycopg.conninfo import conninfo_to_dict

        conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - any refusal (a parse error, an unknown parameter) leaves it hidden
        return False
    return True


def _libpq_password(url: str) -> str | None:
    """The password libpq reads in ``url``: after the first ``:`` of the user part, which ends at the first ``@``
    before a ``/`` (a piece of a longer one a person meant, that libpq may send or quote)."""
    if (scheme := _SCHEME.match(url)) is None:
        return None
    slash = url.find("/", scheme.end())
    at = url.find("@", scheme.end(), len(url) if slash < 0 else slash)
    colon = url.find(":", scheme.end(), max(at, 0))
    return None if at < 0 or colon < 0 else url[colon + 1:at]


def safe_url(url: str) -> str:
    """``url`` as an error message may show it: a password in its user part (``user:PASSWORD@host``: up to the last
    ``@``, :func:`_userinfo`), in a ``password=`` or ``sslpassword=`` parameter (:func:`_secret_param`) or a conninfo
    string's as ``***``; where they overlap (``db:5432/vb?password=a@b``), all of both."""
    url = str(url)
    hidden = [(len(user[0]) + 1, user[2] - 1)] if (user := _userinfo(url)) is not None else []
    hidden += [(start + len(name) + 2, end) for start, end, _sep, name, _v in _params(url) if _secret_param(name)]
    spans: list[list[int]] = []
    for start, end in sorted(hidden):
        if spans and start <= spans[-1][1]:  # overlaps the one before: one "***" for both
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    out, last = [], 0
    for start, end in spans:
        out += [url[last:start], "***"]
        last = end
    conninfo = _SCHEME.match(url) is None
    url = "".join(out) + url[last:]
    if conninfo:  # a conninfo string: host=db password=s3cr3t
        url = _KW_SECRET.sub(lambda m: m[0][:m.start(1) - m.start()] + "***", url)
    return url


def url_secrets(url: str) -> list[str]:
    """The passwords written in ``url`` (its user part to the last ``@`` and as libpq reads it, a ``password=``
    parameter; a conninfo string's ``password=``), as written and percent-decoded, and its first :data:`_TAILS` pieces
    between the ``/ @ ? : , = &`` that end a host, port, database name or parameter for libpq (it reads
    ``vb:s3/cr3t@db`` as the host ``vb``, port ``s3``, and ``vb:p@ss?w=rd@db`` as a parameter ``w`` it names in its
    error; ``vb:p@db?application_name=a@b`` may be the password ``p@db?application_name=a``: the host ``db`` is
    hidden too): what :func:`redact` hides in a message that quotes pieces of the URL (libpq's parse
    errors do)."""
    url = str(url)
    found = [user[1]] if (user := _userinfo(url)) is not None else []
    if found:  # what libpq may read of it as a host, port, database name or parameter
        found += [piece for piece in re.split(r"[/@?:,=&]", found[0], maxsplit=_TAILS) if piece != found[0]]
    found += [] if (libpq := _libpq_password(url)) is None else [libpq]
    found += [value for _s, _e, _sep, name, value in _params(url) if _secret_param(name)]
    if _SCHEME.match(url) is None:
        written = [v[1:-1] if v.startswith("'") else v for v in _KW_SECRET.findall(url)]
        found += written + [re.sub(r"\\(.)", r"\1", v) for v in written]  # as libpq reads one: "a\ b" is "a b"
    return sorted({v for p in found if p for v in (p, unquote(p))}, key=len, reverse=True)


#: a secret this long or longer is hidden wherever it appears in a message; a shorter one only as a word of its own
_WHOLE_FROM = 4
#: the pieces of a password (after its first ``@``s: libpq quotes the host it read, which starts after the first;
#: between its first separators) and the quoted words of a message :func:`redact` looks at, at most: each is a scan of
#: the message or of the password, and a URL with thousands of ``@`` took seconds
_TAILS = 64
#: a quoted word of a message, as libpq and psycopg quote what they read: ``"..."`` or ``'...'``
_QUOTED_WORD = re.compile(r""""[^"\n]*"|'[^'\n]*'""")


def redact(message: str, url: str) -> str:
    """``message`` with ``url`` shown as :func:`safe_url` shows it and any password of it as ``***``; the pieces of a
    password after an ``@`` too, where an ``@`` follows them (libpq read ``S3C@RET@db`` as the host ``RET@db``), and
    whatever the message quotes that is part of one (libpq: ``invalid URI query parameter: "w"`` for ``p@ss?w=rd``)."""
    message = str(message).replace(str(url), safe_url(url))
    secrets = url_secrets(url)
    quoted = list(dict.fromkeys(w[1:-1] for w in _QUOTED_WORD.findall(message)))[:_TAILS]  # each: a scan of each
    leaked = {w for w in quoted if w and any(w in s for s in secrets)}  # what libpq quotes of a password it split
    message = _QUOTED_WORD.sub(lambda m: f"{m[0][0]}***{m[0][0]}" if m[0][1:-1] in leaked else m[0], message)
    for secret in secrets:  # a short one (a piece of a password split at a "/": "a" of a/bc...) only as a word of
        # its own: replaced everywhere, it made "cannot" "c***nnot"
        message = (message.replace(secret, "***") if len(secret) >= _WHOLE_FROM else
                   re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", message))
    tails = {s.split("@", i)[-1] for s in secrets for i in range(1, min(s.count("@"), _TAILS) + 1)}
    for tail in sorted(tails, key=len, reverse=True):
        if tail:
            message = message.replace(tail + "@", "***@")
    return message


def _port(host: str) -> str:
    """The port written after ``host`` (``db:5432``, ``[::1]:5432``), "" without one."""
    after = host.rpartition("]")[2]
    return after.rpartition(":")[2] if ":" in after else ""


def check_pg_userinfo(url: str, what: str = "PostgreSQL URL") -> str:
    """``url`` unless libpq would read part of its user part as the host: InputError, without the URL, when the host
    libpq reads (after the first ``@``, up to ``/`` or ``?``) holds another ``@`` -- an ``@`` in the user name or
    password that is not written ``%40`` -- or when the database name (after the first ``/``) holds one: a ``/`` in
    the password not written ``%2F`` (``alice:S3C/RET@db`` made libpq resolve the host ``alice``, port ``S3C``), or
    any later part holds one after a port that is no number (``alice:S3C/R?x=ET@db``: a query, for libpq)."""
    if _SCHEME.match(str(url)) is None:  # a conninfo string (application_name=http://a@b@c): no user part to misread
        return url
    rest = str(url).partition("://")[2]
    head, _, path = rest.partition("/")  # libpq looks for the user part's "@" up to the first "/"
    after = rest.partition("@")[2] if "@" in head else rest  # from the host libpq reads on
    hosts = re.split(r"[/?]", after, maxsplit=1)[0]
    odd_port = "@" in after and not all(_port(h).isdigit() for h in hosts.split(",") if _port(h))
    # the database name holds an "@": a raw "/" in the password (even after an "@"); or an "@" after a port libpq
    # cannot read (vb:k9/Qz?x=7Lm@db: the host "vb", port "k9", then a query), a raw "/" then "?" in the password
    if "@" in path.partition("?")[0] or ("@" not in head and odd_port):
        raise InputError(f"the {what} has an '@' after its first '/', where the database name is: write a '/' in the "
                         "password (or user name) as %2F, e.g. postgresql://alice:p%2Fss@db.example/vecbridge, and an "
                         "'@' in a database name as %40 (the URL is not repeated here: it may hold a password)")
    # libpq reads a bracketed host to its "]" whatever is inside: vb:ab@[Pie?ce@[::1]:5432 names the host
    # "Pie?ce@[::1" (a piece of a password with a raw "@[", which its errors would quote)
    if any(re.fullmatch(r"[\w:.%-]*", b) is None for b in re.findall(r"\[([^\]]*)", after.partition("/")[0])):
        raise InputError(f"the {what} has a '[' that does not open an IPv6 address: write a '[' in the password (or "
                         "user name) as %5B (the URL is not repeated here: it may hold a password)")
    if "@" in hosts or odd_port:  # alice@corp:Pa?ss=word@db: the host "corp", port "Pa", then a query
        raise InputError(f"the {what} has more than one '@' before its host: write an '@' in the password (or "
                         "user name) as %40, e.g. postgresql://alice:p%40ss@db.example/vecbridge (the URL is not "
                         "repeated here: it may hold a password)")
    return url


#: libpq's words for where it tried to connect: ``server at "db.internal" (10.0.0.5), port 5432``, ``on socket
#: "/run/postgresql/.s.PGSQL.5432"``, ``host name "db.internal"``; psycopg 3's: ``failed to resolve host
#: 'db.internal'``, and ``host: 'db.internal', port: '5432', hostaddr: '10.0.0.5'`` naming each attempt of several
_QUOTED = r"""(?:'[^']*'|"[^"]*"|None)"""  # a Python repr of a str (or None), as psycopg writes them
# ... and vecbridge's own: ``pgvector: cannot connect to user@db:5432/vb: ...`` (``milvus: cannot connect to
# http://db:19530: ...``: the target runs to the ": " before the driver's words, spaces included, as a socket
# folder's ``u@/tmp/my dir/vb``; the registry's "cannot connect to PostgreSQL registry: " names none),
# ``qdrant: https://db:6333 refused the request``; pymilvus's ``server on db:19530``
_ENDPOINT = re.compile(r'(server at )"[^"]*"(?: \([^)]*\))?, port \d+|(on socket )"[^"]*"|(host name )"[^"]*"'
                       rf"|(failed to resolve host ){_QUOTED}|(host: ){_QUOTED}, port: {_QUOTED}, hostaddr: {_QUOTED}"
                       r"|(cannot connect to )(?!PostgreSQL registry: )[^\n]+?(?=: )"
                       r"|(qdrant: )\S+(?= refused the request)"
                       r"|(connecting to server on )[^\s,]+")


def hide_endpoints(message: str) -> str:
    """``message`` with the host, address, port or socket a database driver names (libpq: ``connection to server at
    "127.0.0.1", port 5432 failed``) shown as ``***``: what an answer to a client may show (an unauthenticated
    ``/readyz`` showed the registry's address to anyone); the logs keep the whole message."""
    return _ENDPOINT.sub(lambda m: f"{next(g for g in m.groups() if g)}***", str(message))
