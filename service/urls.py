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
_KW_SECRET = re.compile(r"(?:^|\s)(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


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


#: a URL's scheme, then its user part as libpq reads it: up to the first ``@`` before any ``/`` (libpq reads on past a
#: ``?``: ``db:5432?x=a@b`` is the user ``db``, password ``5432?x=a``), and on to each further ``@`` a raw ``@`` in the
#: password may have left in the host libpq reads (``S3C@RET@db``) -- never past a ``/`` or a query parameter
#: (``?name=``) after the first ``@``: ``vb:pw@db?application_name=a@b`` is the host ``db`` (it was hidden as password)
_USER = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/@]*(?:@[^/?@]*(?:\?[^/=@]*)?)*)@")
#: a user part with a ``/`` not written ``%2F`` (``vb:s3/cr3t@db``, which libpq misreads as the host ``vb``, port
#: ``s3``): up to the first ``@`` after that ``/`` and on to further ones, never past a query parameter
_USER_SLASHED = re.compile(
    r"([A-Za-z][A-Za-z0-9+.-]*://)([^/@:?#]*:[^@/?#]*/[^@?]*(?:\?[^=@]*)?(?:@[^?@]*(?:\?[^=@]*)?)*)@")


def _userinfo(url: str) -> tuple[str, str, int] | None:
    """``url`` up to its password's ``:``, the password (:data:`_USER`, else :data:`_USER_SLASHED`; after the user
    part's first ``:``, so a raw ``@`` in the user name -- ``alice@corp:pw@db`` -- hides it too) and where its
    closing ``@`` ends; None without one."""
    m = _USER.match(url) or _USER_SLASHED.match(url)
    if m is None or ":" not in m[2]:
        return None
    user, _, password = m[2].partition(":")
    return f"{m[1]}{user}", password, m.end()


def safe_url(url: str) -> str:
    """``url`` as an error message may show it: a password in its user part (``user:PASSWORD@host``), in a
    ``password=`` or ``sslpassword=`` parameter (:func:`_secret_param`) or a conninfo string's as ``***``."""
    url = str(url)
    if (user := _userinfo(url)) is not None:
        url = f"{user[0]}:***@{url[user[2]:]}"
    out, last = [], 0
    for start, end, sep, name, _value in _params(url):
        if _secret_param(name):
            out += [url[last:start], f"{sep}{name}=***"]
            last = end
    url = "".join(out) + url[last:]
    if "://" not in url:  # a conninfo string: host=db password=s3cr3t
        url = _KW_SECRET.sub(lambda m: m[0][:m.start(1) - m.start()] + "***", url)
    return url


def url_secrets(url: str) -> list[str]:
    """The passwords written in ``url`` (its user part, a ``password=`` parameter; a conninfo string's
    ``password=``), as written and percent-decoded, and the pieces of one with a ``/`` (libpq reads
    ``vb:s3/cr3t@db`` as the host ``vb``, port ``s3``): what :func:`redact` hides in a message that quotes pieces of
    the URL (libpq's parse errors do)."""
    url = str(url)
    found = [user[1]] if (user := _userinfo(url)) is not None else []
    found += [value for _s, _e, _sep, name, value in _params(url) if _secret_param(name)]
    if "://" not in url:
        found += [v[1:-1] if v.startswith("'") else v for v in _KW_SECRET.findall(url)]
    found += [piece for p in found if "/" in p for piece in p.split("/")]
    return sorted({v for p in found if p for v in (p, unquote(p))}, key=len, reverse=True)


#: a secret this long or longer is hidden wherever it appears in a message; a shorter one only as a word of its own
_WHOLE_FROM = 4


def redact(message: str, url: str) -> str:
    """``message`` with ``url`` shown as :func:`safe_url` shows it and any password of it as ``***``; the pieces of a
    password after an ``@`` too, where an ``@`` follows them (libpq read ``S3C@RET@db`` as the host ``RET@db``)."""
    message = str(message).replace(str(url), safe_url(url))
    secrets = url_secrets(url)
    for secret in secrets:  # a short one (a piece of a password split at a "/": "a" of a/bc...) only as a word of
        # its own: replaced everywhere, it made "cannot" "c***nnot"
        message = (message.replace(secret, "***") if len(secret) >= _WHOLE_FROM else
                   re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", message))
    tails = {s.split("@", i)[-1] for s in secrets for i in range(1, s.count("@") + 1)}
    for tail in sorted(tails, key=len, reverse=True):
        if tail:
            message = message.replace(tail + "@", "***@")
    return message


def check_pg_userinfo(url: str, what: str = "PostgreSQL URL") -> str:
    """``url`` unless libpq would read part of its user part as the host: InputError, without the URL, when the host
    libpq reads (after the first ``@``, up to ``/`` or ``?``) holds another ``@`` -- an ``@`` in the user name or
    password that is not written ``%40`` -- or when the database name (after the first ``/``) holds one: a ``/`` in
    the password not written ``%2F`` (``alice:S3C/RET@db`` made libpq resolve the host ``alice``, port ``S3C``)."""
    rest = str(url).partition("://")[2]
    head, _, path = rest.partition("/")  # libpq looks for the user part's "@" up to the first "/"
    if "@" in path.partition("?")[0]:  # the database name holds an "@": a raw "/" in the password (even after an "@")
        raise InputError(f"the {what} has an '@' after its first '/', where the database name is: write a '/' in the "
                         "password (or user name) as %2F, e.g. postgresql://alice:p%2Fss@db.example/vecbridge, and an "
                         "'@' in a database name as %40 (the URL is not repeated here: it may hold a password)")
    if "@" in head:
        host = re.split(r"[/?]", rest.partition("@")[2], maxsplit=1)[0]
        if "@" in host:
            raise InputError(f"the {what} has more than one '@' before its host: write an '@' in the password (or "
                             "user name) as %40, e.g. postgresql://alice:p%40ss@db.example/vecbridge (the URL is not "
                             "repeated here: it may hold a password)")
    return url


#: libpq's words for where it tried to connect: ``server at "db.internal" (10.0.0.5), port 5432``, ``on socket
#: "/run/postgresql/.s.PGSQL.5432"``, ``host name "db.internal"``; psycopg 3's: ``failed to resolve host
#: 'db.internal'``, and ``host: 'db.internal', port: '5432', hostaddr: '10.0.0.5'`` naming each attempt of several
_QUOTED = r"""(?:'[^']*'|"[^"]*"|None)"""  # a Python repr of a str (or None), as psycopg writes them
_ENDPOINT = re.compile(r'(server at )"[^"]*"(?: \([^)]*\))?, port \d+|(on socket )"[^"]*"|(host name )"[^"]*"'
                       rf"|(failed to resolve host ){_QUOTED}|(host: ){_QUOTED}, port: {_QUOTED}, hostaddr: {_QUOTED}")


def hide_endpoints(message: str) -> str:
    """``message`` with the host, address, port or socket a database driver names (libpq: ``connection to server at
    "127.0.0.1", port 5432 failed``) shown as ``***``: what an answer to a client may show (an unauthenticated
    ``/readyz`` showed the registry's address to anyone); the logs keep the whole message."""
    return _ENDPOINT.sub(lambda m: f"{next(g for g in m.groups() if g)}***", str(message))
