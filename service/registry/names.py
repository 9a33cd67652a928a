"""Name rules and reference parsing.

Map, space and alias names use ``[A-Za-z0-9._-]`` plus the arrow ``->`` (``minilm->e5``), at most
128 characters, not starting with ``.`` or ``-`` (no ``..``, no path separators, no NUL). A
reference to a version is ``name`` (latest live version; for maps the newest not flagged unreliable),
``name@alias`` or ``name:3``.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..errors import shown
from ..limits import MAX_TAG_BYTES
from .errors import InvalidNameError

__all__ = ["check_name", "check_alias", "check_tag_key", "check_tag_value", "check_tag_count", "check_tags", "check_text",
           "check_seed", "parse_ref", "parse_version", "fs_safe", "MAX_NAME", "MAX_ALIAS", "MAX_REF", "MAX_TAG_BYTES",
           "MAX_TAGS", "NAME_PATTERN", "ALIAS_PATTERN", "REF_PATTERN", "utf8_safe"]

MAX_NAME = 128
MAX_ALIAS = 64
MAX_VERSION = 2**31 - 1  # PostgreSQL INTEGER
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]|->)*")
_ALIAS = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*")
_NO_DOTDOT = r"(?!.*\.\.)"


def _up_to(top: int) -> str:
    """A regular expression of the decimal numbers 1 .. ``top`` without leading zeros, digit by digit: the shorter
    numbers, then each prefix of ``top`` followed by a smaller digit and any digits, then ``top`` itself."""
    s = str(top)
    parts = [f"[1-9][0-9]{{0,{len(s) - 2}}}"] if len(s) > 1 else []
    for i, d in enumerate(map(int, s)):
        low, rest = int(i == 0), len(s) - i - 1
        if d > low:
            parts.append(s[:i] + (str(low) if d - 1 == low else f"[{low}-{d - 1}]") + f"[0-9]{{{rest}}}" * (rest > 0))
    return "(?:" + "|".join([*parts, s]) + ")"


#: a version as :func:`parse_version` reads it, at the end of the text: ASCII digits, at most 10 (leading zeros
#: too), 1 .. MAX_VERSION. Before, ``[0-9]{1,10}``: the document declared ``name:0`` and ``name:9999999999`` valid
_VERSION_RE = rf"(?=[0-9]{{1,10}}$)0*{_up_to(MAX_VERSION)}"
#: The rules of :func:`check_name`, :func:`check_alias` and :func:`parse_ref` as whole-string patterns (JSON Schema /
#: ECMA-262, Python's ``re`` alike: the OpenAPI document declares them), made of the expressions the checks use
NAME_PATTERN = rf"^{_NO_DOTDOT}(?:{_NAME.pattern})$"
ALIAS_PATTERN = rf"^{_NO_DOTDOT}(?:{_ALIAS.pattern})$"
REF_PATTERN = (rf"^{_NO_DOTDOT}(?=[^@:]{{1,{MAX_NAME}}}(?:[@:]|$))(?:{_NAME.pattern})"  # name, @alias or :N
               rf"(?:@(?=.{{1,{MAX_ALIAS}}}$)(?:{_ALIAS.pattern})|:{_VERSION_RE})?$")
MAX_REF = MAX_NAME + 1 + MAX_ALIAS  # name@alias


def check_name(name, what: str = "name") -> str:
    """Return ``name`` if it is a valid map/space name, else raise InvalidNameError."""
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"{what} must be a non-empty string")
    if len(name) > MAX_NAME:
        raise InvalidNameError(f"{what} {shown(name)} is longer than {MAX_NAME} characters")
    if ".." in name or not _NAME.fullmatch(name):
        raise InvalidNameError(
            f"{what} {shown(name)} is not allowed: use ASCII letters, digits, '.', '_', '-' and '->' "
            "(no path separators, no '..', not starting with '.' or '-')")
    return name


def check_alias(alias) -> str:
    """Aliases: a letter or '_' first, then ``[A-Za-z0-9._-]``; purely numeric aliases are refused."""
    if (not isinstance(alias, str) or not alias or len(alias) > MAX_ALIAS or ".." in alias
            or not _ALIAS.fullmatch(alias)):
        raise InvalidNameError(f"alias {shown(alias)} is not allowed: 1-{MAX_ALIAS} ASCII letters, digits, '.', '_', "
                               "'-' (no '..'), starting with a letter or '_'")
    return alias


#: a version's most tags; a value's most UTF-8 bytes is ``limits.MAX_TAG_BYTES`` (HTTP's bound on its compact JSON):
#: one bound for every writer (HTTP, the CLI, a fit's tags, a bundle import), so what one wrote another reads
MAX_TAGS = 256


def check_tag_key(key) -> str:
    """A tag key: 1-128 characters, no NUL, no ``/``, not ``.`` or ``..`` (a route's path segment could not name it:
    a URL resolves the dot segments away, and the client refuses them)."""
    if not isinstance(key, str) or not key or len(key) > 128 or "\x00" in key or "/" in key or key in (".", ".."):
        raise InvalidNameError(f"tag key {str(key)[:40]!r} is not allowed (1-128 characters, no '/' or NUL, "
                               "not '.' or '..')")
    return key


#: the ``eval.*`` tags path choice reads (:func:`~service.registry.quality.judged`; ``eval --record`` writes them) and
#: what each must hold: a hand-set ``eval.n_candidates 0`` (or -5) made ``eval.top1`` count unscaled, and decide
EVAL_TAGS = {"eval.top1": ("a share in [0, 1]", lambda x: 0.0 <= x <= 1.0),
             "eval.recall@10": ("a share in [0, 1]", lambda x: 0.0 <= x <= 1.0),
             "eval.top1_chance_p": ("a probability in [0, 1]", lambda x: 0.0 <= x <= 1.0),
             "eval.n_candidates": ("an integer >= 2", lambda x: x >= 2 and x == int(x)),
             "eval.n_queries": ("an integer >= 1", lambda x: x >= 1 and x == int(x))}


def check_tag_value(value, key: str) -> str:
    """``str(value)``, refused (InvalidNameError) past :data:`MAX_TAG_BYTES` UTF-8 bytes or holding NUL: the CLI
    stored 100 KB tags that HTTP refuses and a bundle import then refused whole; one of :data:`EVAL_TAGS` that does not
    hold what it must."""
    text = check_text(str(value), f"tag {key!r}")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_TAG_BYTES:
        raise InvalidNameError(f"tag {key[:40]!r} is longer than {MAX_TAG_BYTES} bytes")
    if key in EVAL_TAGS:
        try:
            x = float(text)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and EVAL_TAGS[key][1](x)):
            raise InvalidNameError(f"tag {key!r} must be {EVAL_TAGS[key][0]}, got {text[:40]!r}: path choice reads it "
                                   "(`vecbridge eval --record` writes it)")
    return text


def check_tag_count(n: int, what: str) -> None:
    if n > MAX_TAGS:
        raise InvalidNameError(f"{what} would have {n} tags; at most {MAX_TAGS}")


def check_tags(tags, what: str) -> dict[str, str]:
    """``{key: text}`` of a version's ``tags`` (a dict or None), each key and value checked, at most :data:`MAX_TAGS`."""
    out = {check_tag_key(k): check_tag_value(v, k) for k, v in (tags or {}).items()}
    check_tag_count(len(out), what)
    return out


def check_text(value, what: str):
    """Return ``value``; a string holding NUL raises InvalidNameError (PostgreSQL's TEXT cannot store it, so
    neither backend takes it: the same input is refused alike on SQLite)."""
    if isinstance(value, str) and "\x00" in value:
        raise InvalidNameError(f"{what} must not contain NUL characters")
    if isinstance(value, str):
        try:  # a lone surrogate (from a bad decode) was a raw UnicodeEncodeError at the database
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidNameError(f"{what} holds a lone surrogate character, which is not text") from None
    return value


def utf8_safe(obj):
    """``obj`` with every string made valid UTF-8 (dicts, lists and tuples walked): an undecodable byte of a file
    name (``os.fsdecode``'s surrogate escape, e.g. ``bad\\udcff.npy``) as ``\\xff`` (``bad\\xff.npy``), any other
    lone surrogate as its ``\\udXXX`` escape. A path recorded as read (`fit --source $'bad\\xff.npy'`) crashed the
    fit report's write (exit 3 with the version registered) and every JSON answer naming it (500)."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
            return obj
        except UnicodeEncodeError:
            try:
                return obj.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:  # a surrogate no file name decodes to (e.g. half a pair, from JSON)
                return obj.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(obj, dict):
        return {utf8_safe(k): utf8_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [utf8_safe(v) for v in obj]
    return obj


def check_seed(random_state) -> int | None:
    """``random_state`` as the int a record stores (None stays None); InvalidNameError past a signed 64-bit integer
    (a raw OverflowError on SQLite, NumericValueOutOfRange on PostgreSQL) or for what is not an integer."""
    if random_state is None:
        return None
    if isinstance(random_state, bool) or not isinstance(random_state, (int, np.integer)) or not (
            -(2**63) <= int(random_state) < 2**63):
        raise InvalidNameError(f"random_state must be an integer within 64 bits, got {str(random_state)[:40]}")
    return int(random_state)


def parse_ref(ref, noun: str = "map") -> tuple[str, str | None, int | None]:
    """Split a reference to a ``noun`` (``"map"``, ``"steer"``: words the errors) into ``(name, alias, version)``
    (at most one of the last two set).

    >>> parse_ref("minilm->e5@prod")
    ('minilm->e5', 'prod', None)
    >>> parse_ref("minilm->e5:3")
    ('minilm->e5', None, 3)
    """
    if not isinstance(ref, str) or not ref:
        raise InvalidNameError(f"{noun} reference must be a non-empty string")
    if "@" in ref:
        name, alias = ref.rsplit("@", 1)
        return check_name(name, f"{noun} name"), check_alias(alias), None
    if ":" in ref:
        name, ver = ref.rsplit(":", 1)
        return check_name(name, f"{noun} name"), None, parse_version(ver, f"version in {ref[:60]!r}")
    return check_name(ref, f"{noun} name"), None, None


def parse_version(text, what: str = "version", low: int = 1) -> int:
    """A version number written as text (a reference's ``:N``, a CLI argument, an HTTP path segment): ASCII digits
    only, ``low`` .. :data:`MAX_VERSION`; else InvalidNameError (a ValueError) saying ``what`` must be. ``int()``
    alone reads '1_0' as 10, '２' (fullwidth) as 2 and ' +1 ' as 1, and str.isdigit() takes '²' (int() then fails).

    >>> parse_version("12")
    12
    """
    ok = isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 10
    if not ok or not low <= int(text) <= MAX_VERSION:
        raise InvalidNameError(f"{what} must be an integer {low} .. {MAX_VERSION} in ASCII digits")
    return int(text)


def fs_safe(name: str) -> str:
    """A file-system friendly form of a (valid) name: ``->`` becomes ``_to_``."""
    return check_name(name).replace("->", "_to_")
