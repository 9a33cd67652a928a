"""Base64 float32 on the wire (pybase64 on both sides): the same text as the standard library, bit-exact round
trips client -> service -> client, no text the standard library refuses is accepted, and the client's JSON
bodies with base64 spliced in unscanned are the JSON ``json.dumps`` writes."""

from __future__ import annotations

import base64
import binascii
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from align.exceptions import InputError
from service.api import codec
from service.client_wire import Base64Text, b64, dumps, rows
from _api_support import R, served_world

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
float32s = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
matrices = st.tuples(st.integers(1, 40), st.integers(1, 24)).flatmap(
    lambda s: arrays(np.float32, s, elements=float32s))


@settings(max_examples=150, deadline=None)
@given(matrices)
def test_client_text_is_the_standard_one_and_round_trips_bit_for_bit(A):
    body = b64(A)
    assert type(body["vectors_b64"]) is Base64Text and body["dim"] == A.shape[1]
    assert body["vectors_b64"] == base64.b64encode(A.tobytes()).decode()
    got = codec._b64_matrix(body["vectors_b64"], body["dim"], name="vectors")  # what the service reads
    assert got.tobytes() == A.tobytes()  # NaN payloads and signed zeros too
    back = rows({"vectors_b64": codec.b64_encode(got), "shape": list(A.shape)})  # what the client reads back
    assert back.tobytes() == A.tobytes() and back.flags.writeable


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ALPHABET + " \n*-_é\x00", max_size=40))
def test_no_text_the_standard_library_refuses_is_accepted(text):
    try:
        ours = codec._b64decode_blocks(text)
    except (binascii.Error, ValueError):
        return
    assert base64.b64decode(text, validate=True) == ours


@settings(max_examples=100, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.binary(max_size=30).map(lambda b: Base64Text(base64.b64encode(b).decode())),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6) | st.integers(0, 9), kids,
                                                               max_size=4),
    max_leaves=12))
def test_bodies_with_spliced_base64_are_the_json_json_dumps_writes(body):
    assert json.loads(dumps(body)) == json.loads(json.dumps(body, separators=(",", ":")))


def test_what_json_cannot_carry_is_still_refused_beside_base64():
    A = np.ones((2, 3), np.float32)
    for bad in ({"x": float("nan"), **b64(A)}, {**b64(A), "inner": {"x": float("inf"), **b64(A)}},
                {(1, 2): 0, **b64(A)}, {**b64(A), "o": object()}):
        with pytest.raises(InputError, match="request body"):
            dumps(bad)


@pytest.mark.parametrize("text, why", [
    ("AAAA AAA=", "a space"), ("AAAA\nAAA=", "a newline"), ("AA=AAAAA", "padding inside"), ("AAAAAAé=", "non-ASCII"),
    ("AAAAAA", "no padding"), ("AAAA-_AA", "the URL-safe alphabet"),
])
def test_the_service_refuses_malformed_base64_with_a_422(tmp_path, text, why):
    with served_world(tmp_path) as (client, _, _):
        r = client.post("/v1/maps/a2b/transform", json={"vectors_b64": text, "dim": 16}, headers=R)
    assert r.status_code == 422, (why, r.text)
    assert "not valid base64" in r.json()["error"]["message"], why


def test_a_whole_transform_through_the_client_in_json_equals_binary(tmp_path):
    from _api_support import populate, settings_for
    from _servers import serve_in_thread

    from service.api import create_app
    from service.client import Client

    app = create_app(settings_for(tmp_path, max_batch=5000))
    with serve_in_thread(app) as url:
        data = populate(app.state.vb.registry)
        X = np.random.default_rng(3).standard_normal((3000, 16)).astype(np.float32)
        with Client(url, api_key="rkey-123") as c:
            Yj = c.transform("a2b", X, binary=False)
            Yb = c.transform("a2b", X)
    assert Yj.tobytes() == Yb.tobytes()
    np.testing.assert_allclose(Yb, data["a2b"].apply(X), rtol=1e-6, atol=1e-6)
