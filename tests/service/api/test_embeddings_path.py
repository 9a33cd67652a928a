"""/v1/embeddings with target_space: the map path is resolved before any text is encoded."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.api import create_app
from _api_support import R, W, settings_for


def test_unknown_target_space_or_path_is_a_404_before_the_encoder_loads(tmp_path, monkeypatch):
    import service.encoders

    asked = []
    monkeypatch.setattr(service.encoders, "get_encoder", lambda name: asked.append(name))  # the one encoder loader
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        state = app.state.vb
        state.registry.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
        state.registry.register_space("e5", 384, encoder="multilingual-e5-small")
        for target, why in (("nowhere", "unknown space"), ("e5", "no chain of maps")):
            r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": ["a dog"], "target_space": target})
            assert r.status_code == 404 and why in r.json()["error"]["message"], r.text
        assert asked == []  # no encoder was asked for, so nothing was loaded or encoded


def test_dimensions_that_do_not_match_the_target_space_are_a_422_before_any_text_is_encoded(tmp_path, monkeypatch):
    """``dimensions`` with ``target_space``: the width is known once the path is resolved. Before, every text was
    encoded (a batch of 2,048 texts: seconds of CPU) and mapped, and only then refused; now the 422 comes first.
    The matching width answers as before. Real MiniLM from its wheel; its encode calls counted, not replaced."""
    import numpy as np
    import pytest

    pytest.importorskip("sentence_transformers")
    import align
    from service.encoders import Encoder

    calls = []
    real = Encoder.encode
    monkeypatch.setattr(Encoder, "encode", lambda self, texts, *a, **k: calls.append(len(texts)) or real(self, texts,
                                                                                                        *a, **k))
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        reg = app.state.vb.registry
        reg.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
        reg.register_space("small", 128)
        rng = np.random.default_rng(0)
        X = rng.standard_normal((400, 384)).astype(np.float32)
        m = align.fit_ridge(X, X @ rng.standard_normal((384, 128)).astype(np.float32), alpha=1.0)
        reg.register_version("m2s", m, source_space="minilm", target_space="small", method="ridge", params={})
        body = {"model": "minilm", "input": ["a dog", "a cat"], "target_space": "small"}
        r = c.post("/v1/embeddings", headers=R, json={**body, "dimensions": 384})
        assert r.status_code == 422 and "space 'small' is 128-d" in r.json()["error"]["message"], r.text
        assert calls == []
        r = c.post("/v1/embeddings", headers=R, json={**body, "dimensions": 128})
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 128, r.text
        assert calls == [2]
        r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": ["a dog"], "dimensions": 128})
        assert r.status_code == 422 and "cannot be truncated" in r.json()["error"]["message"], r.text


def test_whitespace_only_input_is_a_422_like_the_empty_string(tmp_path, monkeypatch):
    """"" was refused but " " (or "\\n\\t") was embedded as the empty text: the same meaningless vector for any
    of them, 200. Refused before any encoder is loaded."""
    import service.encoders

    asked = []
    monkeypatch.setattr(service.encoders, "get_encoder", lambda name: asked.append(name))
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        for bad in (" ", ["a dog", "\n\t "]):
            r = c.post("/v1/embeddings", headers=R, json={"model": "all-MiniLM-L6-v2", "input": bad})
            assert r.status_code == 422 and "whitespace" in r.json()["error"]["message"], r.text
    assert asked == []


def test_input_of_only_invisible_characters_is_a_422_like_whitespace(tmp_path, monkeypatch):
    """A NUL, U+200B (zero-width space), a BOM or another control or format character alone passed the "every
    input must have text" check (str.strip() keeps them) and was embedded as the empty text: the same meaningless
    vector for all of them, 200. Now a 422 naming the input, before any encoder is loaded; text with such
    characters in it (an emoji ZWJ sequence) is still embedded."""
    import service.encoders

    asked = []
    monkeypatch.setattr(service.encoders, "get_encoder", lambda name: asked.append(name))
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        for bad in ("\x00", ["a dog", "\u200b"], ["a dog", "x", " \ufeff\x01 \u2060"]):
            r = c.post("/v1/embeddings", headers=R, json={"model": "all-MiniLM-L6-v2", "input": bad})
            assert r.status_code == 422, r.text
            msg = r.json()["error"]["message"]
            name = "input is" if isinstance(bad, str) else f"input[{len(bad) - 1}] is"  # one string: as sent
            assert msg.startswith(name) and "invisible" in msg, msg
        assert asked == []
        from service.encoders import has_text

        assert has_text("\U0001f468\u200d\U0001f469\u200d\U0001f467") and has_text("a\x00b") and has_text("مرحبا")


def test_one_model_by_id_or_alias_is_its_list_entry_and_an_unknown_one_a_404(tmp_path):
    """``GET /v1/models/{id}`` (OpenAI's ``client.models.retrieve``) was the router's bare 404 for every id. Now a
    name or a short alias (as ``POST /v1/embeddings`` takes) answers the ``GET /v1/models`` entry, and an unknown
    id is a 404 naming the known encoders."""
    with TestClient(create_app(settings_for(tmp_path))) as c:
        listed = c.get("/v1/models", headers=R).json()["data"]
        assert len(listed) >= 2
        for entry in listed:
            r = c.get(f"/v1/models/{entry['id']}", headers=R)
            assert r.status_code == 200 and r.json() == entry, r.text
        by_id = {m["id"]: m for m in listed}
        assert c.get("/v1/models/minilm", headers=R).json() == by_id["all-MiniLM-L6-v2"]
        for unknown in ("nope", "all-MiniLM-L6-v2/x", "MINILM"):
            r = c.get(f"/v1/models/{unknown}", headers=R)
            assert r.status_code == 404, r.text
            assert f"unknown encoder {unknown!r}" in r.json()["error"]["message"] and "all-MiniLM-L6-v2" in r.text
        # through the app's encoder lookup: "unknown encoder 'nope' (unknown encoder 'nope'; known: ...)" said it twice
        for path, body in (("/v1/embeddings", {"input": "x", "model": "nope"}),
                           ("/v1/spaces", {"name": "sp", "encoder": "nope"})):
            message = c.post(path, json=body, headers=W).json()["error"]["message"]
            assert message.startswith("unknown encoder 'nope'; known: ") and message.count("nope") == 1, message
            assert "; installed: " in message, message
        assert c.get("/v1/models/minilm").status_code == 401
        r = c.get("/v1/models/" + "x" * 5000, headers=R)
        assert r.status_code == 422 and len(r.content) < 500, r.text


def test_the_models_space_is_the_one_with_a_way_to_the_target_never_the_first_by_name(tmp_path):
    """Two spaces made by MiniLM ("a-mini-enc", "mini-enc") and a map from "mini-enc" to e5: /v1/embeddings with
    target_space e5 took "a-mini-enc" (first by name) and answered 404 "no chain of maps", and `map` naming the
    right map was refused as leading from the wrong space. The model's space is now the one with a way there; two
    with different maps are a 409 until `map` names one; a space named like the model goes first."""
    import numpy as np
    import pytest

    pytest.importorskip("sentence_transformers")
    import align

    app = create_app(settings_for(tmp_path))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 384)).astype(np.float32)

    def fit(name, source):
        m = align.fit_ridge(X, X @ rng.standard_normal((384, 384)).astype(np.float32), alpha=1.0)
        return reg.register_version(name, m, source_space=source, target_space="e5", method="ridge", params={})

    with TestClient(app) as c:
        reg = app.state.vb.registry
        reg.register_space("mini-enc", 384, encoder="all-MiniLM-L6-v2")
        reg.register_space("a-mini-enc", 384, encoder="minilm")
        reg.register_space("e5", 384, encoder="multilingual-e5-small")
        fit("me", "mini-enc")
        body = {"model": "all-MiniLM-L6-v2", "input": ["a dog"], "target_space": "e5"}
        for extra in ({}, {"map": "me"}, {"map": ["me:1"]}):
            r = c.post("/v1/embeddings", headers=R, json={**body, **extra})
            assert r.status_code == 200 and [m["name"] for m in r.json()["maps"]] == ["me"], r.text
        fit("ame", "a-mini-enc")                                      # now both spaces have a way to e5
        r = c.post("/v1/embeddings", headers=R, json=body)
        assert r.status_code == 409, r.text
        assert "a-mini-enc, mini-enc" in r.json()["error"]["message"] and "`map`" in r.text
        for ref in ("me", "ame"):
            r = c.post("/v1/embeddings", headers=R, json={**body, "map": ref})
            assert r.status_code == 200 and r.json()["maps"][0]["name"] == ref, r.text
        reg.register_space("minilm", 384)                             # named like the model (short alias), no encoder
        fit("named", "minilm")
        for model in ("minilm", "all-MiniLM-L6-v2"):
            r = c.post("/v1/embeddings", headers=R, json={**body, "model": model})
            assert r.status_code == 200 and r.json()["maps"][0]["name"] == "named", r.text
        r = c.post("/v1/embeddings", headers=R, json={**body, "map": "nope"})
        assert r.status_code == 404, r.text


def test_the_installed_encoders_named_in_a_404_are_the_installed_ones(tmp_path):
    """Embedding with a known encoder whose wheel is not installed (mpnet without its extra) answered "needs the
    package ...; installed: all-MiniLM-L6-v2, all-mpnet-base-v2, ..." — every known encoder, that one too."""
    import pytest

    from service.encoders import list_encoders

    encoders = list_encoders()
    missing = [e["name"] for e in encoders if not e["installed"]]
    if not missing:
        pytest.skip("every known encoder is installed here")
    installed = sorted(e["name"] for e in encoders if e["installed"])
    with TestClient(create_app(settings_for(tmp_path))) as c:
        r = c.post("/v1/embeddings", headers=R, json={"model": missing[0], "input": ["a dog"]})
        assert r.status_code == 404, r.text
        named = r.json()["error"]["message"].rsplit("installed: ", 1)[1]
        assert named == (", ".join(installed) or "none"), r.text


def test_an_empty_map_is_a_422_like_an_empty_list_not_the_registry_path(tmp_path):
    """``"map": ""`` was taken as no map (200 through the registry's path) where ``[]`` was a 422."""
    with TestClient(create_app(settings_for(tmp_path))) as c:
        state = c.app.state.vb
        state.registry.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
        r = c.post("/v1/indexes", headers=W, json={"name": "docs", "space": "minilm", "kind": "flat"})
        assert r.status_code == 201, r.text
        for path, body in (("/v1/embeddings", {"model": "minilm", "input": ["a dog"], "target_space": "minilm"}),
                           ("/v1/indexes/docs/search", {"vectors": [[1.0] * 384], "space": "minilm", "k": 1})):
            for empty in ("", []):
                r = c.post(path, headers=R, json={**body, "map": empty})
                assert r.status_code == 422 and "map" in r.text, (path, empty, r.status_code, r.text[:300])


LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~360 word pieces: past MiniLM's 256


def test_texts_cut_at_the_models_limit_are_counted_and_truncate_false_refuses_them(tmp_path, monkeypatch):
    """MiniLM reads a text's first 256 word pieces: the answer said nothing of the texts it cut (``vecbridge embed``
    counted them). Now ``usage.truncated`` counts them, and ``truncate: false`` (text-embeddings-inference's flag)
    refuses them, a 422 naming the first (``input[i]``, its tokens, the limit) before anything is encoded. e5's
    engine reads a long text whole: none cut, none refused. Real encoders from their wheels."""
    import numpy as np
    import pytest

    pytest.importorskip("sentence_transformers")
    from service.encoders import Encoder

    calls = []
    real = Encoder.encode
    monkeypatch.setattr(Encoder, "encode", lambda self, texts, *a, **k: calls.append(len(texts)) or real(self, texts,
                                                                                                        *a, **k))
    texts = ["a cat", LONG, LONG + " and a volcano"]
    with TestClient(create_app(settings_for(tmp_path))) as c:
        r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": texts})
        assert r.status_code == 200 and r.json()["usage"]["truncated"] == 2, r.text
        E = np.asarray([d["embedding"] for d in r.json()["data"]])
        assert float(E[1] @ E[2]) > 0.9999  # the cut dropped the difference
        calls.clear()
        r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": texts, "truncate": False})
        assert r.status_code == 422 and calls == [], r.text
        msg, detail = r.json()["error"]["message"], r.json()["error"]["details"][0]
        assert "input[1] is " in msg and "more than the 256 all-MiniLM-L6-v2 reads" in msg and "2 of 3" in msg, msg
        assert detail["loc"] == ["body", "input", 1] and detail["ctx"]["max_tokens"] == 256, detail
        assert 300 < detail["ctx"]["tokens"] < 420 and f"is {detail['ctx']['tokens']} tokens long" in msg, detail
        short = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": texts[:1], "truncate": False})
        assert short.status_code == 200 and short.json()["usage"]["truncated"] == 0, short.text
        np.testing.assert_allclose(short.json()["data"][0]["embedding"], E[0], atol=1e-6)  # as with truncate true
        r = c.post("/v1/embeddings", headers=R, json={"model": "e5", "input": texts, "truncate": False})
        assert r.status_code == 200 and r.json()["usage"]["truncated"] == 0, r.text
        r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": texts, "truncate": "no"})
        assert r.status_code == 422 and "truncate" in r.json()["error"]["message"], r.text


def test_usage_counts_the_tokens_the_model_read_not_words(tmp_path):
    """``usage.prompt_tokens`` counted whitespace-separated words (an OpenAI or text-embeddings-inference client
    budgets by tokens): it counts the tokens the model read, specials included, a text cut at the limit as the
    limit (TEI's count); e5 reads a text whole, ``passage: `` / ``query: `` prefix included. Real encoders."""
    import pytest

    pytest.importorskip("sentence_transformers")
    from service.encoders import get_encoder

    texts = ["a cat", LONG, LONG + " and a volcano"]  # 2 + 360 + 363 words; 4 + 256 + 256 MiniLM tokens
    with TestClient(create_app(settings_for(tmp_path))) as c:
        r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": texts})
        assert r.status_code == 200, r.text
        assert r.json()["usage"] == {"prompt_tokens": 516, "total_tokens": 516, "truncated": 2}, r.json()["usage"]
        r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": "a cat"})
        assert r.json()["usage"]["prompt_tokens"] == 4, r.text
        for kind in ("passage", "query"):
            r = c.post("/v1/embeddings", headers=R, json={"model": "e5", "input": texts[:2], "input_type": kind})
            want = sum(get_encoder("e5").tokens_read(texts[:2], kind))
            assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == want > 256 + 5, (r.text[-200:], want)


def test_one_string_too_long_is_named_input_not_input_0(tmp_path):
    """``input`` sent as one string, not a list, was refused as ``input[0]`` "(1 of 1 texts are)": it is named as
    sent, ``input``, in the message and in ``details[0].loc``."""
    import pytest

    pytest.importorskip("sentence_transformers")
    with TestClient(create_app(settings_for(tmp_path))) as c:
        r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": LONG, "truncate": False})
        assert r.status_code == 422, r.text
        msg, detail = r.json()["error"]["message"], r.json()["error"]["details"][0]
        assert "input is " in msg and "input[" not in msg and "texts are" not in msg, msg
        assert detail["loc"] == ["body", "input"] and detail["ctx"]["max_tokens"] == 256, detail
        r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": [LONG], "truncate": False})
        assert "input[0] is " in r.json()["error"]["message"], r.text  # a list of one: its row


def test_one_empty_string_is_named_input_not_input_0(tmp_path, monkeypatch):
    """``"input": ""`` (one string, not a list) was refused as ``input[0]``, a row of a list the client never sent;
    it is ``input``, as the too-long string is. A list keeps its row's index. No encoder is loaded for either."""
    import service.encoders

    asked = []
    monkeypatch.setattr(service.encoders, "get_encoder", lambda name: asked.append(name))
    with TestClient(create_app(settings_for(tmp_path))) as c:
        for bad in ("", " \u200b"):
            r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": bad})
            msg = r.json()["error"]["message"]
            assert r.status_code == 422 and msg.startswith("input is empty") and "input[" not in msg, r.text
        r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": ["a dog", ""]})
        assert r.status_code == 422 and r.json()["error"]["message"].startswith("input[1] is empty"), r.text
    assert asked == []
