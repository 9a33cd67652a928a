"""The limits table: every size the service accepts, in one object, and the checks that read it.

One :class:`Limits` lives in :class:`service.config.Settings` (``settings.limits``, environment
``VECBRIDGE_LIMITS__<FIELD>``), so an operator tunes them in one place. HTTP checks them (422 beyond,
413 for bodies and batches), the CLI and the index store use the same functions, and the app
factory writes the table into the OpenAPI description. The schema-level bounds (pydantic
``le=``/``max_length=``) are the defaults below: a ceiling no setting can raise.

Index parameters are validated by :func:`check_index_params`, the one gate in front of FAISS
(HTTP create, CLI ``index create``, and loading a persisted index all pass through it): FAISS
aborts, crashes or loops forever on some illegal values (HNSW ``M < 2``, IVF ``nlist`` above the
training rows, negative seeds), so nothing reaches it unchecked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from align.exceptions import InputError
from align.validation import MAX_EPS

__all__ = [
    "Limits", "DEFAULT_LIMITS", "FIXED_LIMITS", "MAX_DIM", "MAX_ID", "MAX_SEED", "MAX_DESCRIPTION", "MAX_TAG_BYTES",
    "MAX_EXPLICIT_ID", "MAX_JSON_DEPTH", "MAX_NEW_TOKENS", "MAX_PATH_MAPS", "INDEX_PARAM_RULES", "IVF_TRAIN_PER_LIST",
    "IVF_MAX_PER_LIST", "MAX_EF_SEARCH", "MAX_NLIST", "MAX_NPROBE", "MAX_CSLS_K", "MAX_VERIFY_K", "EXACT_FLOAT_INT",
    "MAX_MIGRATE_BATCH", "MAX_MIGRATE_PAUSE", "MAX_VERIFY_SAMPLE", "MAX_VERIFY_QUERIES", "MAX_LENS_K",
    "MAX_LENS_DIRECTIONS",
    "whole_int",
    "check_index_params", "seed_of", "check_dim", "check_json_depth", "check_int_literal", "JSON_INT_RANGE",
    "parse_strict_int", "check_range", "default_nlist", "default_nprobe", "IVF_SCAN_ROWS",
    "ivf_training", "limits_markdown", "WHOLE_BODY", "whole_body_command", "json_type",
]

MAX_DIM = 65_536  # columns of a space / index / vector
MAX_ID = 2**62  # index ids are < MAX_ID, so next automatic id + any batch stays far below 2**63 - 1
#: Explicit ids (an add's or create's ``ids``) are < MAX_EXPLICIT_ID; automatic ids go on up to MAX_ID - 1. Automatic
#: ids count from one past the largest id the index ever held and are never reused, so one explicit id at the top of
#: the whole range (2**62 - 1, a client's mistake) left no automatic id for any client, for good, even once deleted.
#: Below this ceiling an explicit id always leaves 2**61 (2.3e18) automatic ids: a million adds a second for 73,000
#: years. Ids stored before the ceiling (up to 2**62 - 1) still load, search and delete.
MAX_EXPLICIT_ID = 2**61
MAX_SEED = 2**31 - 1  # FAISS k-means seeds are C ints
MAX_DESCRIPTION = 4_096  # characters
MAX_TAG_BYTES = 16_384  # a tag value, as compact JSON
MAX_JSON_DEPTH = 32  # nesting of any JSON body (payloads, tags, params)
MAX_NEW_TOKENS = 256  # tokens one LM generate request may ask for
MAX_PATH_MAPS = 16  # maps a search may name as its path (`map` as a list)
# IVF k-means sample: rows per list by default (pgvector's ivfflat samples 50 per list; FAISS asks for 39..256) and
# at most (FAISS's k-means keeps max_points_per_centroid = 256 per list and discards the rest of a larger sample)
IVF_TRAIN_PER_LIST = 64
IVF_MAX_PER_LIST = 256
#: Bound of a steer's strength ``eps`` (1: the trained strength) wherever a steer moves vectors: apply, steered
#: search, the CLI; the LM routes' bound too (``service.ops.lm.MAX_LM_EPS``). Strength sweeps saturate below 100.
#: Past it the answer is the steer's direction alone: a unit row's own part of ``q (I + eps W)`` is ~1 /
#: (|eps| |q W|), under float32's resolution (6e-8) from |eps| sigma ~ 1e8, and the values, up to 1 + |eps| sigma,
#: pass 1.8e19 (their squares overflow float32 in a client's norm) and then 3.4e38 (a NotRepresentableError).
#: One number with the library's bound (``align.validation.MAX_EPS``, which ``check_eps`` enforces).
MAX_STEER_EPS = MAX_EPS


#: limits shown in the table that the checks read from constants (pydantic schemas, codec, name rules), not from
#: the settings: any other value is refused when the settings load instead of being accepted and ignored
FIXED_LIMITS = ("max_dim", "max_name", "max_description", "max_tag_bytes", "max_json_depth")


class Limits(BaseModel):
    """Sizes the service accepts (one table; ``GET /v1/info`` and the OpenAPI description show it)."""

    model_config = ConfigDict(extra="forbid")  # VECBRIDGE_LIMITS='{"max_kk": 5}' is refused, not ignored

    body_bytes_json: int = Field(64 * 1024 * 1024, ge=1, description="JSON bodies on bulk routes (one parse holds "
                                                                     "the GIL, ~3 ms/MB: lower it to bound the event-loop "
                                                                     "stall; binary bodies keep max_body_bytes)")
    body_bytes_texts: int = Field(4 * 1024 * 1024, ge=1, description="Text routes (embeddings, LM): body bytes.")
    body_bytes_small: int = Field(64 * 1024, ge=1, description="Metadata routes (spaces, aliases, tags, steer "
                                                             "transfers): body bytes.")
    max_k: int = Field(1_000, ge=1, le=10_000, description="Search: results per query.")
    max_hits: int = Field(100_000, ge=1, description="Search: queries × k per request (bounds the response).")
    max_response_values: int = Field(4 * 1024 * 1024, ge=1, description="Transform: rows × columns returned as "
                                                                       "JSON numbers (base64 and binary: no cap)")
    max_response_bytes: int = Field(64 * 1024 * 1024, ge=1, description="Search: bytes of the JSON answer "
                                                                       "(hits with payloads)")
    max_dim: int = Field(MAX_DIM, ge=1, le=MAX_DIM, description="Columns of a space, index or vector (fixed).")
    max_name: int = Field(128, description="Characters of a map, space, index or steer name (fixed).")
    max_description: int = Field(MAX_DESCRIPTION, ge=0, le=MAX_DESCRIPTION,
                                 description="Characters of a description (fixed).")
    max_tag_bytes: int = Field(MAX_TAG_BYTES, ge=1, le=MAX_TAG_BYTES,
                               description="A tag value as compact JSON (fixed).")
    max_json_depth: int = Field(MAX_JSON_DEPTH, ge=1, le=MAX_JSON_DEPTH, description="Nesting of JSON bodies (fixed).")
    lm_max_new_tokens: int = Field(MAX_NEW_TOKENS, ge=1, le=MAX_NEW_TOKENS, description="LM generate: "
                                                                                  "`max_new_tokens`.")
    lm_max_tokens: int = Field(2_048, ge=2, le=1_048_576, description="LM generate / analyze: tokens of the prompt "
                                                                      "or text (never beyond the model's context "
                                                                      "window, which counts the new tokens too)")
    lm_max_waiting: int = Field(16, ge=0, le=10_000, description="LM generate / analyze: requests waiting for the "
                                                                 "model while it is busy (beyond: 429)")
    lm_max_fit_texts: int = Field(16_384, ge=2, le=1_048_576, description="LM steer fit: texts (64 tokens each at "
                                                                          "most) per job")

    @field_validator(*FIXED_LIMITS)
    @classmethod
    def _fixed(cls, value: int, info) -> int:
        default = cls.model_fields[info.field_name].default
        if value != default:
            raise ValueError(f"fixed at {default}: the schemas and parsers check this limit with that constant, "
                             f"so another value would be shown in /v1/info and ignored; unset it")
        return value


DEFAULT_LIMITS = Limits()
_BEYOND = {"lm_max_waiting": "429", "lm_max_fit_texts": "413"}  # the status beyond a limit, when not 422


def limits_markdown(limits: Limits, max_batch: int, max_body_bytes: int, body_timeout_s: float | None = None,
                    extra: tuple = ()) -> str:
    """The limits table as Markdown (for the OpenAPI description); ``extra``: more ``(limit, value, beyond)`` rows
    (the server's own: timeouts, concurrency)."""
    rows = [("Bulk routes (transform, index create/add, search, fits, steers): binary body bytes "
             "(`max_body_bytes`)", max_body_bytes, "413"), ("Rows per request (`max_batch`)", max_batch, "413")]
    for name, field in Limits.model_fields.items():
        rows.append((f"{field.description.rstrip('.')} (`{name}`)", getattr(limits, name),
                     _BEYOND.get(name, "413" if name.startswith("body_bytes") else "422")))
    rows.append(("Index ids: explicit (`ids`); automatic ones go on up to 2**62 - 1", "0 ≤ id < 2**61", "422"))
    if body_timeout_s is not None:
        rows.append(("Silence while a request body is being sent (`body_timeout_s`)", f"{body_timeout_s:g} s", "408"))
    rows.extend(extra)
    return "| limit | value | beyond |\n|---|---|---|\n" + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)


# --- scalars ------------------------------------------------------------------------------------
def parse_strict_int(text: Any, what: str, lo: int, hi: int) -> int:
    """``text`` as an int in ``[lo, hi]``: ASCII digits only (no ``²``, no full-width, no ``1e3``)."""
    if isinstance(text, bool):
        raise InputError(f"{what} must be an integer, got {text!r}")
    if isinstance(text, str) and 0 < len(text) <= 20 and text.isascii() and text.isdigit():
        text = int(text)
    elif not isinstance(text, int):
        raise InputError(f"{what} must be an integer written with ASCII digits, got {str(text)[:40]!r}")
    return check_range(text, what, lo, hi)


#: every integer below this magnitude is exactly one float and no other integer rounds to it; a whole float of this
#: magnitude or more may be a rounded integer (2**53 + 1 becomes 2**53)
EXACT_FLOAT_INT = 2**53


def whole_int(value: Any) -> Any:
    """``value`` as an integer field of JSON reads it: a whole float below 2**53 is that int (``16.0`` is 16); an int,
    or anything else, comes back unchanged for the caller's own check to refuse or take; ValueError (naming the value)
    for a fraction, a NaN / infinity or a whole float of 2**53 or more. The one reading of the integer fields of a JSON
    body (:mod:`service.api.number_types`), of the numbers a route reads from the raw body itself (``dim`` beside
    ``vectors_b64``: :func:`service.api.codec.body_dim`) and of index parameters (:func:`check_index_params`)."""
    if type(value) is not float:
        return value  # an int passes; anything else meets the strict int's refusal
    if not math.isfinite(value):
        raise ValueError(f"must be an integer, got {value!r} (not a finite number)")
    if not value.is_integer():
        raise ValueError(f"must be an integer, got {value!r} (a fraction is not rounded)")
    if abs(value) >= EXACT_FLOAT_INT:
        raise ValueError(f"must be an integer, got {value!r}: a whole number of 2**53 or more written as a float may "
                         "have lost digits on its way; write it as an integer literal")
    return int(value)


def check_range(value: int, what: str, lo: int, hi: int) -> int:
    """``value`` when ``lo <= value <= hi``, else InputError naming ``what`` and the range."""
    if not lo <= value <= hi:
        raise InputError(f"{what} must be between {lo} and {hi}, got {value}")
    return value


def check_dim(dim: Any, what: str = "dim", max_dim: int = MAX_DIM) -> int:
    return parse_strict_int(dim, what, 1, max_dim)


#: the integers a stored JSON value may hold: orjson, which writes every answer, refuses others (a payload read from
#: a file with 123456789012345678901234567890 made every HTTP search that hit its row a 500)
JSON_INT_RANGE = (-(2**63), 2**64 - 1)


def check_int_literal(value: int, what: str = "body") -> int:
    """``value`` when inside :data:`JSON_INT_RANGE`, else InputError naming ``what`` (to send it as a string)."""
    if not JSON_INT_RANGE[0] <= value <= JSON_INT_RANGE[1]:
        shown = str(value) if len(str(value)) <= 40 else str(value)[:37] + "..."
        raise InputError(f"{what}: the integer {shown} does not fit in 64 bits and would lose digits (a payload "
                         f"value can be sent as a string; ids, counts and seeds must fit their ranges)")
    return value


def check_json_depth(obj: Any, max_depth: int = MAX_JSON_DEPTH, what: str = "body") -> bool:
    """Refuse JSON nested deeper than ``max_depth`` (iterative: deep input cannot exhaust the stack), and integers
    outside :data:`JSON_INT_RANGE` (:func:`check_int_literal`). Returns whether ``obj`` holds a whole float of
    magnitude >= 2**63: what an integer literal past 64 bits becomes when orjson parses it (the HTTP codec then reads
    the body again to tell one from a literal such as ``1e20``)."""
    stack, lossy = [(obj, 1)], False
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            if type(node) is int:
                check_int_literal(node, what)
            elif type(node) is float and abs(node) >= 2.0**63 and node.is_integer():
                lossy = True
            continue
        if depth > max_depth:
            raise InputError(f"{what} is nested deeper than {max_depth} levels")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)) or type(c) in (int, float))
    return lossy


# --- index parameters ---------------------------------------------------------------------------
# kind -> {param: (lo, hi)}; hi may be a callable of the row count (IVF lists need training rows).
#: HNSW search breadth, the index's parameter and a search request's ``ef_search`` alike
MAX_EF_SEARCH = 32_768
#: IVF lists of an index, and lists one search probes (an index's ``nprobe`` and a search's: HTTP's ``nprobe``, the
#: CLI's ``--nprobe``; a C int in FAISS, so a bound each face checks before the call, with one message)
MAX_NLIST = MAX_NPROBE = 65_536
#: neighbours of CSLS's hubness term ``r(d)`` (a search's ``csls_k``, ``--csls-k``): one FAISS search of that breadth
MAX_CSLS_K = 1_000
#: the k of a verification's recall@k (HTTP's ``k``, ``vecbridge verify --k``): a search of the collection that deep
MAX_VERIFY_K = 1_000
#: a migration's rows per step (HTTP's ``batch_size``, ``migrate --batch-size``) and its sleep after each, seconds
#: (``pause``, ``--pause``)
MAX_MIGRATE_BATCH = 100_000
MAX_MIGRATE_PAUSE = 60
#: a verification's sampled rows (``n_sample``, ``verify --n-sample``) and engine-search queries (``queries``,
#: ``--queries``)
MAX_VERIFY_SAMPLE = 100_000
MAX_VERIFY_QUERIES = 10_000
#: a steer lens's items at each extreme (``k``, ``steer lens -k``) and its singular directions (``n_directions``,
#: ``--directions``)
MAX_LENS_K = 100
MAX_LENS_DIRECTIONS = 1_024
INDEX_PARAM_RULES: dict[str, dict[str, tuple[int, int]]] = {
    "flat": {},
    "hnsw": {"M": (2, 256), "ef_construction": (1, 4_096), "ef_search": (1, MAX_EF_SEARCH)},
    "ivf": {"nlist": (1, MAX_NLIST), "nprobe": (1, MAX_NPROBE), "train_rows": (1, IVF_MAX_PER_LIST * MAX_NLIST)},
}


def _int_param(value: Any, name: str, lo: int, hi: int) -> int:
    """An integer index parameter in ``[lo, hi]``, a whole float read as every integer field reads it
    (:func:`whole_int`: below 2**53 only; 1e300 was taken as the int it rounds to and refused with its 301 digits).
    A NumPy float is read as the float it holds (``np.float64(32.0)`` from an array or a config read by NumPy was
    refused once whole_int took only ``float`` itself)."""
    if isinstance(value, np.floating):
        value = float(value)
    try:
        value = whole_int(value)
    except ValueError as exc:
        raise InputError(f"index parameter {name} {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"index parameter {name} must be an integer, got {value!r}")
    return check_range(value, f"index parameter {name}", lo, hi)


def seed_of(params: dict | None, random_state: Any, given: bool) -> int:
    """An index's seed: ``random_state`` when the caller gave it, else ``params["random_state"]`` (an index's info
    reports its seed there, so its params can be sent back as they are), else ``random_state`` (0 by default).
    Checked as every index parameter is (a whole float such as ``3.0`` is the int 3; else :class:`InputError`), so
    the int returned is the seed every random step of the build uses."""
    if not given and isinstance(params, dict) and "random_state" in params:
        random_state = params["random_state"]
    return _int_param(0 if random_state is None else random_state, "random_state", 0, MAX_SEED)


def json_type(value: Any) -> str:
    """``value``'s JSON type as a client wrote it (``null``, ``boolean``, ``number``, ``string``, ``array``,
    ``object``), for "must be an object, got ..." (Python's ``NoneType`` / ``list`` / ``str`` named no JSON type)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def check_index_params(kind: str, params: dict | None, *, n_rows: int | None = None, dim: int | None = None,
                       random_state: Any = 0) -> dict:
    """Validated copy of ``params`` for an index of ``kind``; :class:`InputError` (422) otherwise.

    Legal ranges: HNSW ``2 ≤ M ≤ 256``, ``1 ≤ ef_construction ≤ 4096``, ``1 ≤ ef_search ≤ 32768``;
    IVF ``1 ≤ nlist ≤ min(65536, n_rows)`` (k-means needs a row per list), ``1 ≤ nprobe ≤ nlist``,
    ``nlist ≤ train_rows ≤ 256 nlist`` (the k-means sample; ``nlist`` the given one, else the default for
    ``n_rows``; a sample above ``n_rows`` is every row, :func:`ivf_training`);
    ``0 ≤ random_state ≤ 2**31 - 1`` (the argument; a ``random_state`` key in ``params``, as an index's info
    reports it, must equal it: a caller that takes the seed from ``params`` when none was given passes it);
    ``1 ≤ dim ≤ 65536``. Unknown keys are refused (a typo would otherwise be ignored silently). ``n_rows=None``
    (loading a persisted index) skips the row check.
    """
    if kind not in INDEX_PARAM_RULES:
        raise InputError(f"index kind must be one of {sorted(INDEX_PARAM_RULES)}, got {kind!r}")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InputError(f"index params must be an object, got {json_type(params)}")
    rules = INDEX_PARAM_RULES[kind]
    random_state = _int_param(random_state, "random_state", 0, MAX_SEED)
    out: dict = {}
    for key, value in params.items():
        if key == "random_state":  # an index's params as its info reports them; one seed only (it was replaced)
            out[key] = _int_param(value, key, 0, MAX_SEED)
            if out[key] != random_state:
                raise InputError(f"params.random_state ({out[key]}) differs from the index's random_state "
                                 f"({random_state}): give the seed once, as random_state (`--random-state` on the "
                                 f"command line)")
            continue
        if key not in rules:
            allowed = sorted(rules) or "none"
            raise InputError(f"unknown parameter {key!r} for a {kind} index (allowed: {allowed})")
        lo, hi = rules[key]
        out[key] = _int_param(value, key, lo, hi)
    if dim is not None:
        check_dim(dim)
    if kind == "ivf":
        if n_rows is not None and "nlist" in out and out["nlist"] > n_rows:
            raise InputError(f"index parameter nlist={out['nlist']} exceeds the {n_rows} training rows "
                             f"(k-means needs at least one row per list); omit nlist to choose ~4·sqrt(n)")
        if "nprobe" in out and "nlist" in out and out["nprobe"] > out["nlist"]:
            raise InputError(f"index parameter nprobe={out['nprobe']} exceeds nlist={out['nlist']}")
        nlist = out.get("nlist") or (default_nlist(n_rows) if n_rows else None)
        if "train_rows" in out and nlist is not None:
            _check_train_rows(out["train_rows"], nlist, given="nlist" in out)
    return out


def _check_train_rows(train_rows: int, nlist: int, given: bool) -> None:
    which = f"nlist={nlist}" if given else f"the default nlist={nlist} for these rows"
    if train_rows < nlist:
        raise InputError(f"index parameter train_rows={train_rows} is below {which}: k-means needs at least one "
                         f"row per list (FAISS asks for 39; omit train_rows for {IVF_TRAIN_PER_LIST} per list)")
    if train_rows > IVF_MAX_PER_LIST * nlist:
        raise InputError(f"index parameter train_rows={train_rows} exceeds {IVF_MAX_PER_LIST} x nlist = "
                         f"{IVF_MAX_PER_LIST * nlist} ({which}): FAISS's k-means would discard the rest")


def default_nlist(n_rows: int) -> int:
    """IVF lists for ``n_rows`` training rows: ~4·sqrt(n), at most n/39 (FAISS wants ≥ 39 rows per list)."""
    return max(1, min(int(4 * math.sqrt(n_rows)), n_rows // 39 or 1, INDEX_PARAM_RULES["ivf"]["nlist"][1]))


#: rows an IVF search scans at least, by default: ``nprobe`` lists of ``n / nlist`` rows each
IVF_SCAN_ROWS = 1500


def default_nprobe(n_rows: int, nlist: int) -> int:
    """IVF lists probed by default for an index created over ``n_rows`` rows in ``nlist`` lists: enough lists to
    scan :data:`IVF_SCAN_ROWS` rows, at least 16, at most ``nlist``: ``min(nlist, max(16, ceil(1500 nlist / n)))``.

    A fixed 16 probed 3 % of the lists of a 20,000-row index (nlist 512, 39 rows per list): recall@10 0.857 on
    WordNet e5 rows, where 1M rows (nlist 4,000, 250 per list) reach 0.927 with the same 16. Measured on WordNet e5
    (1,000 held-out queries), 16 / this rule: 5k rows 0.906 / 0.98 (39 lists), 20k 0.857 / 0.94 (39), 39k 0.848 /
    0.91 (31); from ~140k rows on (the default nlist) the rule gives 16, as before.
    """
    if n_rows <= 0:
        return max(1, min(16, nlist))
    return max(1, min(nlist, max(16, math.ceil(IVF_SCAN_ROWS * nlist / n_rows))))


def ivf_training(n_rows: int, params: dict) -> tuple[int, int]:
    """``(nlist, train_rows)`` an IVF index over ``n_rows`` rows is built with: k-means of ``nlist`` centroids on
    a seeded sample of ``train_rows`` rows. ``params`` (checked by :func:`check_index_params`) give them, else
    ``nlist = default_nlist(n_rows)`` and ``train_rows = 64 nlist``; the sample is at most every row.

    At 1M rows (nlist 4,000) the default trains on 256,000 rows instead of every row: k-means costs
    ``train_rows x nlist x d`` per iteration, a quarter; measured, the create took 130 s instead of 348 s for a
    recall@10 of 0.927 instead of 0.930 (SCALING.md).
    """
    nlist = int(params.get("nlist") or default_nlist(n_rows))
    return nlist, min(n_rows, int(params.get("train_rows") or IVF_TRAIN_PER_LIST * nlist))


#: routes whose body is one piece (a fit's pairs, a plan's corpus) and the CLI command that runs the same work on
#: files: "send smaller batches" cannot help them (a 1,000-pair 3072-d fit, 82 MB, was told so). The service's 413
#: and the Python client's own refusal both name the command.
WHOLE_BODY = {"/v1/fits": "vecbridge fit", "/v1/plans": "vecbridge plan", "/v1/maps/{ref}/evaluate": "vecbridge eval",
              "/v1/steers": "vecbridge steer fit", "/v1/lm/steers": "vecbridge lm steer-fit",
              "/v1/migrations": "vecbridge migrate --keep-ids --keep-vectors",
              "/v1/verifications": "vecbridge verify --keep-ids --keep-vectors"}


def whole_body_command(path: str | None) -> str | None:
    """The CLI command of :data:`WHOLE_BODY` for a route template or a request path (``/v1/maps/m2e/evaluate``),
    else None."""
    if path is None:
        return None
    if path in WHOLE_BODY:
        return WHOLE_BODY[path]
    parts = path.split("/")
    for template, command in WHOLE_BODY.items():
        t = template.split("/")
        if len(t) == len(parts) and all(a == b or (a.startswith("{") and b) for a, b in zip(t, parts)):
            return command
    return None
