"""Rows that are not numbers are refused over HTTP, not read as numbers (a QA pass: a JSON ``true`` among the
numbers of a transform or a search answered 200 as 1.0, and a .npy body of booleans, a mask sent by mistake, was
mapped as rows of 0/1)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from _api_support import R, W, served_world


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_json_booleans_among_the_vectors_are_a_422(tmp_path):
    with served_world(tmp_path, max_batch=6000, max_body_bytes=8_000_000) as (c, _, world):
        X = world["X"]
        assert c.post("/v1/indexes", headers=W, json={"name": "ib", "space": "b",
                                                      "vectors": world["Y"][:50].tolist()}).status_code == 201
        for n, row in ((3, 0), (3, 2), (5000, 4999)):  # one block of rows, and past the first (4096) of a long body
            rows = X[np.arange(n) % len(X)].tolist()
            rows[row][5] = True
            for url in ("/v1/maps/a2b/transform", "/v1/indexes/ib/search"):
                r = c.post(url, headers=R, json={"vectors": rows})
                assert r.status_code == 422, (url, n, r.text)
                assert f"vectors: row {row} holds a JSON boolean" in r.json()["error"]["message"], r.text
        rows = [[bool(v > 0) for v in x] for x in X[:3]]  # all booleans: numpy reads a bool array
        r = c.post("/v1/maps/a2b/transform", headers=R, json={"vectors": rows})
        assert r.status_code == 422 and "row 0 holds a JSON boolean" in r.text, r.text
        ints = np.where(X[:3] > 0, 1, 0).tolist()  # 0 and 1 written as numbers: still rows of numbers
        assert c.post("/v1/maps/a2b/transform", headers=R, json={"vectors": ints}).status_code == 200
        # a side validated by its pydantic model too (the evaluate body): strict numbers there as well
        side = X[:20].tolist()
        side[3][1] = True
        r = c.post("/v1/maps/a2b/evaluate", headers=R, json={"source": {"vectors": side},
                                                             "target": {"vectors": world["Y"][:20].tolist()}})
        assert r.status_code == 422, r.text


def test_a_boolean_npy_body_is_a_422_saying_how_to_send_0_1(tmp_path):
    with served_world(tmp_path) as (c, _, world):
        X = world["X"][:4]
        r = c.post("/v1/maps/a2b/transform", headers={**R, "content-type": "application/x-npy"}, content=_npy(X > 0))
        assert r.status_code == 422, r.text
        assert "boolean" in r.text and "astype(np.float32)" in r.text, r.text
        r = c.post("/v1/maps/a2b/transform", headers={**R, "content-type": "application/x-npy"},
                   content=_npy((X > 0).astype(np.float32)))
        assert r.status_code == 200, r.text


def test_row_numbers_are_json_integers_as_ids_are(tmp_path):
    """QA: ``relevant: [0, true, 2]``, ``[0, "1", 2]`` and ``[0, 1.0, 2]`` on POST /v1/maps/{ref}/evaluate answered
    200 as rows 0, 1, 2 (pydantic's lax int), as did such ``seed_pairs`` of a fit; the CLI refuses them on purpose.
    A 422 now, as for ``ids``; but for ``1.0``, the whole number the schema's ``type: integer`` takes (JSON Schema
    reads 1.0 as an integer; a fraction, ``1.5``, is refused)."""
    with served_world(tmp_path) as (c, _, world):
        X, Y = world["X"][:40].tolist(), world["Y"][:40].tolist()
        body = {"source": {"vectors": X}, "target": {"vectors": Y}, "queries": {"vectors": Y[:3]}}
        for bad in ([0, True, 2], [0, "1", 2], [0, 1.5, 2]):
            r = c.post("/v1/maps/a2b/evaluate", headers=R, json={**body, "relevant": bad})
            assert r.status_code == 422 and "relevant.1" in r.json()["error"]["message"], (bad, r.text)
        r = c.post("/v1/maps/a2b/evaluate", headers=R, json={**body, "relevant": [0, 1, 2]})
        assert r.status_code == 200, r.text
        whole = c.post("/v1/maps/a2b/evaluate", headers=R, json={**body, "relevant": [0, 1.0, 2]})
        assert whole.status_code == 200 and whole.json() == r.json(), whole.text
        fit = {"name": "seeded", "source_space": "a", "target_space": "b", "source": {"vectors": X},
               "target": {"vectors": Y}, "method": "nonsense"}
        for bad in ([[0, True]], [[0, "1"]], [[1.5, 2]]):
            r = c.post("/v1/fits", headers=W, json={**fit, "seed_pairs": bad})
            assert r.status_code == 422 and "seed_pairs.0" in r.json()["error"]["message"], (bad, r.text)
        r = c.post("/v1/fits", headers=W, json={**fit, "seed_pairs": [[0, 1]]})  # read; the method is what fails
        assert r.status_code == 422 and "seed_pairs" not in r.text and "nonsense" in r.text, r.text
        # a steer's labels (+1 / -1 / 0) too: [1, true, -1] was read as [1, 1, -1]
        steer = {"name": "st", "space": "a", "vectors": X[:6], "labels": [1, True, -1, 0, 1, -1]}
        r = c.post("/v1/steers", headers=W, json=steer)
        assert r.status_code == 422 and "labels.1" in r.json()["error"]["message"], r.text
        r = c.post("/v1/lm/steers", headers=W, json={"name": "lm", "texts": ["a", "b"], "labels": [1, "-1"]})
        assert r.status_code in (422, 503), r.text
        assert r.status_code == 503 or "labels.1" in r.json()["error"]["message"], r.text


def test_a_1d_npy_body_is_one_row_of_exactly_dim_values(tmp_path):
    """QA: an application/x-npy body holding a 1-D array of 32 values, to a 16-d map, was reshaped into 2 rows of
    16 (the codec promises 2-D bodies); 1-D is one row now, so it must hold exactly dim values."""
    with served_world(tmp_path) as (c, _, world):
        X = world["X"]
        hdr = {**R, "content-type": "application/x-npy"}
        r = c.post("/v1/maps/a2b/transform", headers=hdr, content=_npy(X[:2].reshape(-1)))
        assert r.status_code == 422 and "1-D .npy array of 32 values" in r.text, r.text
        one = c.post("/v1/maps/a2b/transform", headers={**hdr, "accept": "application/x-npy"}, content=_npy(X[0]))
        two = c.post("/v1/maps/a2b/transform", headers={**hdr, "accept": "application/x-npy"}, content=_npy(X[:1]))
        assert one.status_code == 200 and one.content == two.content, one.text


def test_a_body_is_looked_at_for_booleans_by_its_bytes():
    """Review: the boolean look read the values of every row holding an exact 0 or 1 (nearly every row of ReLU,
    sparse or integer embeddings), doubling the read of such rows, and took batches of one too (answered on the
    event loop by the fast path). Bodies without ``true`` / ``false`` now skip it: a single block is handed to
    ``as_matrix`` as it was before the look existed, and every route says whether its body can hold one."""
    from service.api.codec import _rows_in_blocks, may_hold_bools, vectors_from_json

    for body in (b'{"vectors": [[1, true]]}', b'{"vectors":[[0,1]],"normalize":false}', b'[false]',
                 b'{"texts": ["' + b"u l " * 200 + b'"], "store_texts":true}', b'{"q": "true"}'):
        assert may_hold_bools(body), body
    for body in (b'{"vectors": [[1e-05, 0, 1, -2.5E+3]], "output": "full", "filter": {"lang": "nl"}}', b"",
                 b'{"texts": ["' + b"tru fals u l " * 200 + b'"]}', b'ue le "tru e" fal se FALSE'):
        assert not may_hold_bools(body), body
    relu = np.maximum(np.random.default_rng(0).normal(size=(40, 8)), 0).round(3).tolist()
    assert _rows_in_blocks(relu, "vectors", bools=False) is relu  # no pass over the rows' values
    long = relu * 120  # 4800 rows: past one block, still converted a block at a time
    got = _rows_in_blocks(long, "vectors", bools=False)
    assert got.dtype == np.float32 and np.array_equal(got, np.asarray(long, np.float32))
    X = vectors_from_json({"vectors": relu}, dim=8, max_batch=100, bools=False)
    assert np.array_equal(X, np.asarray(relu, np.float32))


def test_every_json_rows_route_still_refuses_a_boolean(tmp_path):
    """The routes that read JSON rows each pass their body's ``may_hold_bools``: a ``true`` among the rows of an
    index create or add, a steer fit, a fit side or a plan is still a 422 (or refused by the body's model)."""
    with served_world(tmp_path) as (c, _, world):
        X, Y = world["X"][:40].tolist(), world["Y"][:40].tolist()
        bad = [r[:] for r in Y]
        bad[2][3] = True
        assert c.post("/v1/indexes", headers=W, json={"name": "ok", "space": "b", "vectors": Y}).status_code == 201
        calls = [("/v1/indexes", {"name": "ib", "space": "b", "vectors": bad}),
                 ("/v1/indexes/ok/vectors", {"vectors": bad}),
                 ("/v1/steers", {"name": "st", "space": "b", "vectors": bad, "labels": [1, -1] * 20}),
                 ("/v1/fits", {"name": "f", "source_space": "a", "target_space": "b", "source": {"vectors": X},
                               "target": {"vectors": bad}, "method": "procrustes"}),
                 ("/v1/plans", {"old": X, "probe_source": X, "probe_target": bad})]
        for url, body in calls:
            r = c.post(url, headers=W, json=body)
            assert r.status_code == 422, (url, r.text)
            assert "row 2 holds a JSON boolean" in r.text or "target.vectors.2.3" in r.text \
                or "probe_target" in r.text, (url, r.text)


def test_a_search_looks_for_booleans_only_among_json_rows(tmp_path, monkeypatch):
    """Issue 11 (the per-request floor): base64 rows hold no JSON booleans, and their text is full of the letters
    the look starts from (``u``, ``l``): a batch-1 ``vectors_b64`` search spent ~6 µs looking. It is now made only
    when the rows come as a JSON list, where a ``true`` is still a 422."""
    import base64

    from service.api import codec

    looked: list[bytes] = []
    real = codec.may_hold_bools
    monkeypatch.setattr(codec, "may_hold_bools", lambda body: looked.append(body) or real(body))
    with served_world(tmp_path) as (c, app, world):
        app.state.vb.indexes.create("ix", "b", world["Y"][:50], dim=16)
        Q = world["Y"][:2]
        b64 = {"vectors_b64": base64.b64encode(Q.tobytes()).decode(), "dim": 16, "space": "b", "k": 3}
        r = c.post("/v1/indexes/ix/search", headers=R, json=b64)
        assert r.status_code == 200, r.text
        assert looked == []
        rows = Q.tolist()
        assert c.post("/v1/indexes/ix/search", headers=R, json={"vectors": rows, "space": "b", "k": 3}).json() \
            == r.json()
        assert looked  # JSON rows: looked at
        rows[1][4] = True
        bad = c.post("/v1/indexes/ix/search", headers=R, json={"vectors": rows, "space": "b", "k": 3})
        assert bad.status_code == 422 and "row 1 holds a JSON boolean" in bad.text, bad.text


def test_yes_no_fields_are_json_booleans_as_numbers_are_json_numbers(tmp_path):
    """Review, session 53: ``POST /v1/plans`` ran ``"keep": "yes"`` as true (pydantic's lax bool took "yes", "on",
    "1", 1 and 0) where ``"k": "10"`` was a 422 (strict ints). Every yes/no field of a body is now strict too: a 422
    naming it for anything but ``true`` / ``false``, which are read as before."""
    with served_world(tmp_path) as (c, _, world):
        X, Y = world["X"], world["Y"]
        plan = {"old": {"vectors": X[:300].tolist()}, "probe_source": {"vectors": X[:200].tolist()},
                "probe_target": {"vectors": Y[:200].tolist()}}
        for field, bad in (("keep", "yes"), ("keep", 1), ("keep", "true"), ("k", "10"), ("k", True)):
            r = c.post("/v1/plans", headers=R, json={**plan, field: bad})
            assert r.status_code == 422 and f": {field}: " in r.json()["error"]["message"], (field, bad, r.text)
        r = c.post("/v1/plans", headers=R, json={**plan, "keep": True, "k": 10})
        assert r.status_code == 200 and r.json()["recommended"]["forecast"] == "kept", r.text
        pairs = {"source": {"vectors": X[:40].tolist()}, "target": {"vectors": Y[:40].tolist()}}
        for bad in ("yes", 0, "false"):
            r = c.post("/v1/maps/a2b/evaluate", headers=R, json={**pairs, "csls": bad})
            assert r.status_code == 422 and ": csls: " in r.json()["error"]["message"], (bad, r.text)
            r = c.post("/v1/indexes", headers=W, json={"name": "flags", "space": "b", "store_texts": bad,
                                                       "vectors": Y[:20].tolist()})
            assert r.status_code == 422 and ": store_texts: " in r.json()["error"]["message"], (bad, r.text)
        assert c.post("/v1/maps/a2b/evaluate", headers=R, json={**pairs, "csls": False}).status_code == 200


def _request_models(doc: dict):
    """The pydantic models of every JSON request body the service documents (the OpenAPI requestBody schemas, their
    nested models included), by the component name each is referred to as."""
    from pydantic import BaseModel

    import service.api.app  # noqa: F401  (every schema module loaded)

    names = set()

    def refs(node):
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/components/schemas/") and ref.split("/")[-1] not in names:
                names.add(ref.split("/")[-1])
                refs(doc["components"]["schemas"][ref.split("/")[-1]])
            for v in node.values():
                refs(v)
        elif isinstance(node, list):
            for v in node:
                refs(v)

    for path in doc["paths"].values():
        for op in path.values():
            if isinstance(op, dict) and "requestBody" in op:
                for media in op["requestBody"]["content"].values():  # a body's own schema is inline, by its title
                    names.add(media.get("schema", {}).get("title"))
                refs(op["requestBody"])
    seen, stack = {}, [BaseModel]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if sub.__module__.startswith("service.") and sub.__name__ in names:
                seen[sub.__name__] = sub
    return seen


def test_every_yes_no_field_of_every_request_body_is_a_json_boolean(tmp_path):
    """Review, session 53: ``POST /v1/fits``'s ``paired`` stayed a lax ``bool | None`` after the other yes/no fields
    became strict, so ``"paired": "yes"`` (or 1, "on") was read as true. Every boolean field of every documented
    request body refuses anything but ``true`` / ``false`` (and ``null`` where it is optional)."""
    from pydantic import TypeAdapter, ValidationError

    with served_world(tmp_path) as (c, _, _world):
        models = _request_models(c.get("/openapi.json").json())
    assert {"FitRequest", "PlanRequest", "EvaluateRequest", "SearchRequest"} <= set(models), sorted(models)
    flags = []
    for name, model in models.items():
        for field, info in model.model_fields.items():
            ann = info.rebuild_annotation()
            if "bool" not in repr(ann):
                continue
            flags.append(f"{name}.{field}")
            check = TypeAdapter(ann)
            assert check.validate_python(True) is True and check.validate_python(False) is False, (name, field)
            for bad in ("yes", "true", 1, 0):
                with pytest.raises(ValidationError):
                    check.validate_python(bad)
    assert "FitRequest.paired" in flags and "PlanRequest.keep" in flags, flags


def test_a_fit_with_paired_yes_is_a_422_naming_paired(tmp_path):
    """``POST /v1/fits`` with ``"paired": "yes"`` queued a paired fit; it is a 422 naming ``paired`` now, and
    ``"paired": true`` fits as before."""
    with served_world(tmp_path) as (c, _, world):
        X, Y = world["X"], world["Y"]
        body = {"name": "pp", "source_space": "a", "target_space": "b", "method": "procrustes",
                "source": {"vectors": X[:50].tolist()}, "target": {"vectors": Y[:50].tolist()}}
        for bad in ("yes", 1, "true"):
            r = c.post("/v1/fits", headers=W, json={**body, "paired": bad})
            assert r.status_code == 422 and ": paired: " in r.json()["error"]["message"], (bad, r.text)
        assert c.post("/v1/fits", headers=W, json={**body, "paired": True}).status_code == 202
