"""Findings of a hostile-client QA pass over every route of a real ``vecbridge serve``: each request below was
answered wrongly (200 where a 422 was due, or a 422 whose message misled), and each is answered as it should be."""

from __future__ import annotations

import json
import typing
import warnings

import numpy as np
import pytest
from _api_support import R, W, served_world

DUP = "appears twice in one JSON object"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with served_world(tmp_path_factory.mktemp("hostile")) as (c, app, data):
        r = c.post("/v1/indexes", headers=W, json={"name": "ia", "space": "a", "vectors": data["X"][:40].tolist()})
        assert r.status_code == 201, r.text
        yield c, app, data


def _post(c, url: str, body: bytes, key=R):
    return c.post(url, content=body, headers={**key, "content-type": "application/json"})


def _message(r) -> str:
    return r.json()["error"]["message"]


# --- 1. automatic ids --------------------------------------------------------------------------
def test_one_explicit_id_cannot_use_up_every_clients_automatic_ids(world):
    """One explicit id 2**62 - 1 (in range) left no automatic id, for every client, for good (deleting the row did
    not help: automatic ids count past the largest id ever held). Explicit ids stop at 2**61 now, so 2**61 automatic
    ids are always left; the rule that a stale id never names a new row holds."""
    c, _, data = world
    assert c.post("/v1/indexes", headers=W, json={"name": "ids", "space": "a"}).status_code == 201
    row = data["X"][:1].tolist()
    for top in (2**62 - 1, 2**61):
        r = c.post("/v1/indexes/ids/vectors", headers=W, json={"vectors": row, "ids": [top]})
        assert r.status_code == 422 and "0 .. 2**61 - 1" in _message(r) and str(top) in _message(r), r.text
    for past in (2**62, 2**63 - 1, 2**64 - 1, -1):  # past the stored ids' range too: the explicit range, and the id
        r = c.post("/v1/indexes/ids/vectors", headers=W, json={"vectors": data["X"][:2].tolist(), "ids": [5, past]})
        assert r.status_code == 422 and "between 0 and 2**61 - 1" in _message(r), r.text
        assert f"; {past} is not" in _message(r), r.text
    r = c.post("/v1/indexes/ids/vectors", headers=W, json={"vectors": row, "ids": [2**61 - 1]})
    assert r.status_code == 200, r.text
    assert c.post("/v1/indexes/ids/delete", headers=W, json={"ids": [2**61 - 1]}).json()["deleted"] == 1
    r = c.post("/v1/indexes/ids/vectors", headers=W, json={"vectors": data["X"][1:3].tolist()})
    assert r.status_code == 200 and r.json()["ids"] == [2**61, 2**61 + 1], r.text  # never the deleted id
    doc = c.get("/openapi.json").text
    assert "One id per row, 0 .. 2**61-1" in doc and "0 .. 2**62-1" not in doc


# --- 2. one limit of k -------------------------------------------------------------------------
def test_k_past_max_k_gets_the_one_message_max_k_gives(world):
    """k = 2**31 said "less than or equal to 10000" (the schema's own bound) where /v1/info says max_k is 1000 and
    k = 5000 got "limit of 1000"."""
    c, _, data = world
    q = data["X"][:1].tolist()
    for k in (1001, 5000, 10_001, 2**31):
        r = c.post("/v1/indexes/ia/search", headers=R, json={"vectors": q, "k": k})
        assert r.status_code == 422, r.text
        assert _message(r) == f"k={k} exceeds the limit of 1000 results per query (limits.max_k)", r.text
    assert c.post("/v1/indexes/ia/search", headers=R, json={"vectors": q, "k": 1000}).status_code == 200


# --- 3. strict booleans ------------------------------------------------------------------------
def _request_models():
    import importlib
    import pkgutil

    import service.api as api
    import service.api.routers as routers
    from service.api.body_models import RequestModel

    for pkg in (api, routers):
        for mod in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(mod.name)
    todo, seen = list(RequestModel.__subclasses__()), set()
    while todo:
        model = todo.pop()
        if model not in seen:
            seen.add(model)
            todo.extend(model.__subclasses__())
    return seen


def test_every_yes_no_field_of_every_request_model_takes_true_or_false_only(world):
    """``exact``, ``csls``, ``include_payloads``, ``store_texts``... took 0, -0.0 and "1" (pydantic's lax bool) where
    a number field refuses ``true``."""
    from pydantic import TypeAdapter, ValidationError

    flags = []
    for model in _request_models():
        for name, field in model.model_fields.items():
            kinds = typing.get_args(field.annotation) if typing.get_origin(field.annotation) in (
                typing.Union, type(int | None)) else (field.annotation,)
            if bool in [typing.get_args(k)[0] if typing.get_origin(k) is typing.Annotated else k for k in kinds]:
                flags.append((model.__name__, name))
                check = TypeAdapter(typing.Annotated[(field.annotation, *field.metadata)] if field.metadata
                                    else field.annotation)
                assert check.validate_python(True) is True
                for bad in (0, 1, -0.0, 1.0, "1", "true", "no"):
                    with pytest.raises(ValidationError):
                        check.validate_python(bad)
    assert {("SearchOptions", "exact"), ("SearchOptions", "csls"), ("SearchOptions", "include_payloads"),
            ("IndexAddOptions", "store_texts"), ("FitRequest", "paired")} <= set(flags), flags
    c, _, data = world
    q = data["X"][:1].tolist()
    for field in ("exact", "csls", "include_payloads"):
        for bad in (0, -0.0, "1"):
            r = c.post("/v1/indexes/ia/search", headers=R, json={"vectors": q, "k": 3, field: bad})
            assert r.status_code == 422 and field in _message(r), (field, bad, r.text)
        assert c.post("/v1/indexes/ia/search", headers=R, json={"vectors": q, "k": 3, field: True}).status_code == 200
    r = c.post("/v1/indexes/ia/vectors", headers=W, json={"vectors": data["X"][40:41].tolist(), "store_texts": 0})
    assert r.status_code == 422 and "store_texts" in _message(r), r.text


def test_the_python_client_sends_yes_no_fields_as_booleans_only():
    from align.exceptions import InputError
    from service.client_wire import FLAG_FIELDS, clean

    assert clean({"exact": np.bool_(True), "csls": False, "k": 1, "dry_run": None}) == {"exact": True, "csls": False,
                                                                                       "k": 1}
    assert type(clean({"paired": np.bool_(False)})["paired"]) is bool
    for name in FLAG_FIELDS:
        with pytest.raises(InputError, match=f"{name} must be True or False"):
            clean({name: 1})


# --- 4. repeated keys --------------------------------------------------------------------------
def test_a_key_given_twice_is_refused_by_name(world):
    """``{"k": 3, "k": 7}`` searched with k=7: the last one won without a word."""
    c, _, data = world
    q = json.dumps(data["X"][:1].tolist())
    r = _post(c, "/v1/indexes/ia/search", f'{{"vectors": {q}, "k": 3, "k" : 7}}'.encode())
    assert r.status_code == 422 and f"the key 'k' {DUP}" in _message(r), r.text
    nested = f'{{"vectors": {q}, "payloads": [{{"a": 1, "b": {{"x": 1,\n"x": 2}}}}]}}'.encode()
    r = _post(c, "/v1/indexes/ia/vectors", nested, W)
    assert r.status_code == 422 and f"the key 'x' {DUP}" in _message(r), r.text
    r = _post(c, "/v1/spaces", b'{"name": "dup", "dim": 4, "dim": 8}', W)  # a route whose body pydantic reads
    assert r.status_code == 422 and f"the key 'dim' {DUP}" in _message(r), r.text
    # no repeat: strings that hold a quote and a colon, keys named "vectors" at any depth, objects inside lists
    fine = {"vectors": data["X"][:1].tolist(), "k": 3, "texts": None, "space": "a", "include_payloads": True}
    assert _post(c, "/v1/indexes/ia/search", json.dumps(fine).encode()).status_code == 200
    payloads = [{"text": 'say "k": 7', "vectors": {"k": 1}}, {"text": "\\\": \"", "k": [{"k": 1}]}]
    body = json.dumps({"vectors": data["X"][41:43].tolist(), "payloads": payloads}, indent=1).encode()
    r = _post(c, "/v1/indexes/ia/vectors", body, W)
    assert r.status_code == 200, r.text


def test_the_repeated_key_look_reads_the_vectors_once(world, monkeypatch):
    """The keys are counted in the body's text past its ``vectors`` (found by ``bytes.find``) and in the parsed
    object; only a body whose counts differ is parsed a second time (to name the key), and that second parse reads
    the body without its vectors. Ordinary bodies make the counts differ (stringified JSON in a payload, a list of
    payloads that starts with null): their whole body, rows and all, went through json.loads (a 63.5 MB add: 2.8 s
    and +106 MB where the parse alone took 0.8 s and 46 MB)."""
    from service.api import codec

    again: list[bytes] = []
    real = codec._refuse_repeated_keys
    monkeypatch.setattr(codec, "_refuse_repeated_keys", lambda body: again.append(body) or real(body))
    X = np.random.default_rng(1).standard_normal((3000, 16)).round(4).tolist()
    body = json.dumps({"k": 3, "vectors": X, "payloads": [{"i": i, "t": "a:b"} for i in range(3000)],
                       "ids": list(range(3000))}).encode()
    assert codec.parse_json(body)["k"] == 3 and again == []
    read: list[int] = []  # what the standard library's parser is given, in bytes
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, **kw: read.append(len(text)) or real_loads(text, **kw))
    with pytest.raises(codec.InputError, match=f"the key 'i' {DUP}"):
        codec.parse_json(body.replace(b'{"i": 7, ', b'{"i": 7, "i": 8, '))
    stringified = {"vectors": X, "payloads": [{"meta": json.dumps({"src": i})} for i in range(3000)]}
    first_null = {"payloads": [None] + [{"m": 1}] * 2999, "source": {"vectors": X}, "vectors": X}
    rows = len(json.dumps(X))
    for obj, copies in ((stringified, 1), (first_null, 2)):
        text, read[:] = json.dumps(obj).encode(), []
        assert real_loads(text) == codec.parse_json(text)
        assert len(read) == 1 and read[0] < len(text) - copies * rows + 10, (read, len(text), rows)
    assert len(again) == 3


def test_a_body_too_deep_for_the_second_parse_is_a_422(world):
    """orjson reads 1024 levels, json.loads (the second parse: a repeated key, an integer past 64 bits) ~1000: a
    body between the two was a 500 "internal error"."""
    c, _, data = world
    deep = b"[" * 1000 + b"]" * 1000
    for tail in (b',"space":":"', b',"k":1e19'):  # the repeated-key look, the integer-range look
        r = _post(c, "/v1/indexes/ia/search", b'{"vectors":' + deep + tail + b"}")
        assert r.status_code == 422, r.text
    r = _post(c, "/v1/indexes/ia/search", b'{"vectors":' + deep[:1000] + b"{}" + deep[1000:] + b',"space":":"}')
    assert r.status_code == 422 and "nested too deep" in _message(r), r.text
    r = _post(c, "/v1/indexes/ia/search", b'{"vectors":' + deep + b',"k":1e19}')
    assert "nested too deep" in _message(r), r.text


# --- 5. zero rows through a map ----------------------------------------------------------------
def test_a_transform_refuses_zero_rows_by_row(world):
    """An all-zero row was answered 200 with a non-zero vector (the map's offset), which search and a migration
    refuse: now a 422 naming the row, for JSON and binary bodies (the batch-1 fast path too)."""
    c, _, data = world
    X = data["X"][:5].copy()
    X[3] = 0
    r = c.post("/v1/maps/a2b/transform", headers=R, json={"vectors": X.tolist()})
    assert r.status_code == 422 and r.json()["error"]["type"] == "DegenerateInputError", r.text
    assert "1 all-zero row(s) (row 3)" in _message(r), r.text
    for body in (np.zeros((1, 16), "<f4"), X.astype("<f4")):
        r = c.post("/v1/maps/a2b/transform?output=frame", headers={**R, "content-type": "application/octet-stream"},
                   content=body.tobytes())
        assert r.status_code == 422 and "all-zero row(s) (row " in _message(r), r.text
    assert c.post("/v1/maps/a2b/transform", headers=R, json={"vectors": data["X"][:5].tolist()}).status_code == 200


# --- 8. messages -------------------------------------------------------------------------------
def test_a_string_among_the_numbers_is_named_where_it_is(world):
    c, _, data = world
    rows = data["X"][:3].tolist()
    rows[2][5] = "NaN"
    for url in ("/v1/indexes/ia/search", "/v1/maps/a2b/transform"):
        r = c.post(url, headers=R, json={"vectors": rows})
        assert r.status_code == 422, r.text
        assert "row 2, column 5 holds the string 'NaN': strings are not numbers" in _message(r), r.text


def test_a_body_that_is_not_utf8_is_told_so(world):
    """A UTF-16 body read "str is not valid UTF-8: surrogates not allowed"."""
    c, _, data = world
    doc = json.dumps({"vectors": data["X"][:1].tolist(), "k": 3})
    for body, said in ((doc.encode("utf-16"), "looks like UTF-16"), (doc.encode("utf-16-le"), "looks like UTF-16"),
                       (doc.encode("utf-16-be"), "looks like UTF-16"), (b"\xef\xbb\xbf" + doc.encode(), "byte order"),
                       (doc.encode()[:20] + b"\xff" + doc.encode()[20:], "byte 20 (0xff) is not UTF-8")):
        r = _post(c, "/v1/indexes/ia/search", body)
        assert r.status_code == 422 and said in _message(r) and "UTF-8" in _message(r), r.text
        assert "surrogates" not in _message(r)


# --- 6. CSLS over padded candidates -------------------------------------------------------------
def test_csls_over_padded_candidates_warns_nothing_and_ranks_alike():
    """FAISS pads a short candidate list with -FLT_MAX; ``2 S`` over it overflowed (a RuntimeWarning in the server's
    JSON log) though the padding was then discarded. The ranking is that of the same list padded with -inf."""
    from service.indexes.csls import HubCache, csls_search

    rng = np.random.default_rng(0)
    D = rng.standard_normal((6, 8)).astype(np.float32)
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    Q = D[:2] + 0.1 * rng.standard_normal((2, 8)).astype(np.float32)

    def searcher(pad: float):
        def search(X, k):
            S = X @ D.T
            I = np.argsort(-S, axis=1)[:, :k]
            S = np.take_along_axis(S, I, axis=1)
            short = k - I.shape[1]
            return (np.pad(S, ((0, 0), (0, short)), constant_values=pad).astype(np.float32),
                    np.pad(I, ((0, 0), (0, short)), constant_values=-1))
        return search

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        S, I = csls_search(Q, 4, 3, 40, searcher(np.finfo(np.float32).min), lambda i: D[i], HubCache())
    S_ref, I_ref = csls_search(Q, 4, 3, 40, searcher(-np.inf), lambda i: D[i], HubCache())
    assert np.array_equal(I, I_ref) and np.array_equal(S, S_ref) and (I >= 0).all()


# --- 7. ridge alpha ----------------------------------------------------------------------------
def test_a_ridge_alpha_past_its_range_is_refused_before_the_job(world):
    """``params.alpha = 1e308`` was a 202 and a job that failed late, advising to "scale the map"."""
    c, _, data = world
    side = {"source": {"vectors": data["X"][:40].tolist()}, "target": {"vectors": data["Y"][:40].tolist()}}
    for alpha in (1e308, 1e13):
        r = c.post("/v1/fits", headers=W, json={"name": "r", "source_space": "a", "target_space": "b",
                                                "method": "ridge", "params": {"alpha": alpha}, **side})
        assert r.status_code == 422 and "alpha must be a number in [0, 1e+12]" in _message(r), r.text
