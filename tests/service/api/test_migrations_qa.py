"""What QA of the migration, verification and collection routes found (session 53), each pinned:

- a verification reported no progress and ignored a cancel (one job worker: every other job waited behind it);
- a vector database's host and port reached clients (a 503 of a collection search, a failed job's error);
- ``encoder`` other than the space's registered one ran and said FAIL, blaming the migration;
- a migration cancelled from its progress callback said "cancelled during migrate", not how to resume;
- a collection search with an all-zero query through a map answered 200 with arbitrary hits.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import numpy as np
import pytest
from _api_support import W, settings_for
from fastapi.testclient import TestClient

import align
from align.exceptions import Cancelled, InputError


def _closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def qstore():
    pytest.importorskip("qdrant_client")
    from service.vectordb import QdrantStore

    s = QdrantStore(path=":memory:")
    yield s
    s.close()


def _pairs(n=300, d=16, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return X, (X @ Q).astype(np.float32)


def test_a_row_check_reports_each_batch_and_stops_on_a_cancel(qstore):
    """check_rows reports ``rows`` before each source batch; a progress that raises Cancelled (a job's, on DELETE
    /v1/jobs/{id}) stops it there. Before, it took no progress: a verification ran to its end whatever was asked."""
    from service.vectordb import check_rows, migrate

    X, Y = _pairs()
    m = align.fit_procrustes(X, Y)
    qstore.create("src", X.shape[1])
    qstore.upsert("src", np.arange(len(X)), X)
    migrate(qstore, "src", "dst", m, batch_size=100)
    seen = []
    out = check_rows(qstore, "src", "dst", m, batch_size=50, progress=lambda s, f: seen.append((s, f)))
    assert out["rows_ok"] and [s for s, _ in seen] == ["rows"] * 8, seen  # before and after the target's ids too
    assert [round(f, 3) for _, f in seen] == [0.0, 0.0] + [round(i / 6, 3) for i in range(6)]

    def stop_at_third(stage, f):
        if f >= 2 / 6 - 1e-9:
            raise Cancelled("job x cancelled during rows")

    with pytest.raises(Cancelled):
        check_rows(qstore, "src", "dst", m, batch_size=50, progress=stop_at_third)


def test_a_reembedding_check_reports_its_stages_and_embeds_in_blocks(qstore):
    from service.vectordb import verify_migration
    from service.vectordb.verify import EMBED_BLOCK

    n = EMBED_BLOCK + 44
    X, _ = _pairs(n=n)
    qstore.create("t", X.shape[1])
    qstore.upsert("t", np.arange(n), X, [f"text {i}" for i in range(n)])
    calls, seen = [], []

    def embed(texts):
        calls.append(len(texts))
        return X[[int(t.split()[1]) for t in texts]]

    out = verify_migration(qstore, "t", embed=embed, n_sample=n, n_queries=20, progress=lambda s, f: seen.append(s))
    assert out["partner_top1"] == 1.0 and calls == [EMBED_BLOCK, 44]
    assert seen == ["sample", "sample", "embed", "embed", "search"], seen


def test_verify_refuses_an_encoder_other_than_the_spaces(qstore, monkeypatch):
    """A collection of space e5 (embedded by multilingual-e5-small) verified with all-MiniLM-L6-v2: its texts
    re-embedded by another model can never match; the check ran and said FAIL (cos 0.003), blaming the migration."""
    import service.ops.verify as ov

    X, _ = _pairs(n=20, d=384)
    qstore.create("c", 384)
    qstore.set_space("c", "e5")
    qstore.upsert("c", np.arange(20), X, [f"t{i}" for i in range(20)])
    monkeypatch.setattr(ov, "open_store_for", lambda *a, **kw: _Unclosed(qstore))
    registry = SimpleNamespace(get_space=lambda name: SimpleNamespace(encoder="multilingual-e5-small"))
    with pytest.raises(InputError, match="records space 'e5', embedded by 'multilingual-e5-small'.*"
                                         "all-MiniLM-L6-v2"):
        ov.run_verify(store_url="qdrant://unused", collection="c", encoder="all-MiniLM-L6-v2", registry=registry)


def test_the_encoder_check_is_one_and_says_each_faces_fix():
    """verify, embed --space and the other faces (fit, transform, index, steer) each had a copy of the check that
    texts are embedded by the space's own model: one (service.encoders.space_encoder) now, its refusal worded alike
    ("texts embedded by X would not be comparable with its vectors") and ending on the caller's fix: verify names
    the flag (--encoder NAME) on the command line and the request's field ("encoder") over HTTP. A space registered
    with a model this release does not know: another model is refused, saying the space's cannot be loaded here (it
    was a 404 "unknown encoder" for the space's own name); verify runs as asked there (it cannot know the model is
    another one)."""
    from service.encoders import UnknownEncoderError, space_encoder
    from service.ops.verify import check_encoder_space

    e5 = SimpleNamespace(get_space=lambda name: SimpleNamespace(encoder="multilingual-e5-small"))
    for option, fix in (("--encoder", "verify with the space's encoder: --encoder multilingual-e5-small)"),
                        ("encoder", 'verify with the space\'s encoder: "encoder": "multilingual-e5-small")')):
        with pytest.raises(InputError) as e:
            check_encoder_space(e5, "c", "e5", "all-MiniLM-L6-v2", encoder_option=option)
        assert str(e.value) == ("collection 'c' records space 'e5', embedded by 'multilingual-e5-small': texts "
                                "embedded by 'all-MiniLM-L6-v2' would not be comparable with its vectors (every check "
                                "would fail, whatever the migration did; " + fix), str(e.value)
    check_encoder_space(e5, "c", "e5", "multilingual-e5-small", encoder_option="encoder")  # the space's own: passes
    assert space_encoder("s", "all-MiniLM-L6-v2", "minilm") == "minilm"
    assert space_encoder("s", "all-MiniLM-L6-v2", None) == "all-MiniLM-L6-v2"
    with pytest.raises(InputError, match=r"^space 's' is embedded by 'all-MiniLM-L6-v2'; texts embedded by "
                                         r"'multilingual-e5-small' would not be comparable with its vectors "
                                         r"\(omit the encoder to use the space's\)$"):
        space_encoder("s", "all-MiniLM-L6-v2", "e5")
    # a model this release cannot load is said so, with no fix naming it as an encoder (one the CLI refuses)
    with pytest.raises(InputError, match=r"^space 's' records the model 'their-model', which this release cannot "
                                         r"load: texts embedded by 'all-MiniLM-L6-v2' would not be comparable with "
                                         r"its vectors$"):
        space_encoder("s", "their-model", "minilm", remedy="give --encoder their-model")
    assert space_encoder("s", "sentence-transformers/all-MiniLM-L6-v2", "minilm") == "minilm"  # its hub id: the model
    with pytest.raises(UnknownEncoderError, match="unknown encoder 'nope'"):  # an unknown name given: still a 404
        space_encoder("s", "all-MiniLM-L6-v2", "nope")
    theirs = SimpleNamespace(get_space=lambda name: SimpleNamespace(encoder="their-model"))
    check_encoder_space(theirs, "c", "t", "all-MiniLM-L6-v2")  # unknown to this release: runs as asked


class _Unclosed:
    """``store`` whose close() does nothing (the fixture closes it)."""

    def __init__(self, store):
        self._s = store

    def __getattr__(self, name):
        return (lambda: None) if name == "close" else getattr(self._s, name)


def test_a_migration_cancelled_from_its_progress_says_how_to_resume(qstore):
    """A job's progress raises Cancelled on a cancel: the migration said "job ... cancelled during migrate" then,
    and "stopped after N of M rows ...; run the same command again to resume" only when the stop was seen after."""
    from service.vectordb import MemoryCheckpoint, MigrationInterrupted, migrate

    X, Y = _pairs()
    qstore.create("src", X.shape[1])
    qstore.upsert("src", np.arange(len(X)), X)

    def cancel(p):
        raise Cancelled("job j cancelled during migrate")

    with pytest.raises(MigrationInterrupted, match=r"stopped after 100 of 300 rows .*run the same command again"):
        migrate(qstore, "src", "dst", align.fit_procrustes(X, Y), batch_size=100, checkpoint=MemoryCheckpoint(),
                progress=cancel)


@pytest.mark.parametrize("engine", ["pgvector", "milvus"])
def test_an_unreachable_database_is_not_named_to_clients(tmp_path, engine, caplog):
    """The 503s of a collection search and of a migration request (its check meets the failed connect: no job is
    queued) hide the database's host and port (the log has them): pgvector's said "cannot connect to
    postgres@127.0.0.1:PORT/postgres", Milvus's its URL twice."""
    pytest.importorskip("psycopg" if engine == "pgvector" else "pymilvus")
    from _servers import seed_registry

    from service.api import create_app

    port = _closed_port()
    url = (f"postgresql://postgres@127.0.0.1:{port}/postgres" if engine == "pgvector"
           else f"milvus://127.0.0.1:{port}")
    seed_registry(tmp_path / "data")
    with TestClient(create_app(settings_for(tmp_path, vectordb_url=url))) as c:
        r = c.post("/v1/collections/docs/search", json={"vectors": [[1.0] * 16], "space": "a", "k": 1}, headers=W)
        assert r.status_code == 503, r.text
        m = c.post("/v1/migrations", json={"source": "s", "target": "t", "map": "a2b"}, headers=W)
        assert m.status_code == 503 and m.headers.get("retry-after"), m.text
        assert c.get("/v1/jobs", headers=W).json()["data"] == []
        listed = c.get("/v1/jobs", headers=W).text
    said = r.json()["error"]["message"] + m.json()["error"]["message"] + listed
    assert "cannot connect to ***" in m.json()["error"]["message"], m.text
    assert "cannot connect to ***" in r.json()["error"]["message"]
    assert str(port) not in said and "127.0.0.1" not in said, said


def test_a_zero_query_through_a_map_is_refused_as_an_index_search_refuses_it(qstore):
    """A collection of space b searched with space-a queries: an all-zero one went through the map to its offset
    and was ranked (200, arbitrary hits); an index search refuses it by name."""
    from service.ops.vectordb import search_collection

    X, Y = _pairs()
    m = align.fit_procrustes(X, Y)
    qstore.create("b_rows", X.shape[1])
    qstore.set_space("b_rows", "b")
    qstore.upsert("b_rows", np.arange(50), m.apply(X[:50], output="raw"))
    resolver = SimpleNamespace(translation=lambda s, t, ref: SimpleNamespace(map=m, describe=lambda: []))
    ok = search_collection(qstore, resolver, "b_rows", X[:3], space="a", k=1)
    assert [h[0]["id"] for h in ok["results"]] == [0, 1, 2]
    with pytest.raises(InputError, match="all-zero"):
        search_collection(qstore, resolver, "b_rows", np.zeros((1, X.shape[1]), np.float32), space="a", k=1)


def test_an_http_stale_checkpoint_refusal_gives_http_words(tmp_path):
    """A request cannot pass ``--checkpoint FILE`` (the CLI's flag), which its refusal told it to."""
    pytest.importorskip("qdrant_client")
    from service.ops.vectordb import run_migration
    from service.vectordb import CheckpointMismatchError, open_store

    X, Y = _pairs(n=40)
    url = f"qdrant://{tmp_path / 'qd'}"
    with open_store(url) as s:
        s.create("src", X.shape[1])
        s.upsert("src", np.arange(40), X)
    m, ck = align.fit_procrustes(X, Y), tmp_path / "ck.json"
    run_migration(store_url=url, source="src", target="dst", map_ref=m, checkpoint=ck, space_option="source_space")
    with open_store(url) as s:
        s.drop("dst")
    for option, word in (("source_space", "migrate into another target name"), ("--source-space", "--checkpoint")):
        with pytest.raises(CheckpointMismatchError) as e:
            run_migration(store_url=url, source="src", target="dst", map_ref=m, checkpoint=ck, space_option=option)
        assert word in str(e.value) and (option.startswith("--") or "--checkpoint" not in str(e.value)), str(e.value)


class _Watched(_Unclosed):
    """A real store whose ``ids`` / ``count`` / ``scan`` / ``fetch`` calls are counted; ``ids`` may ask a cancel as
    it returns (``stop``: the flag a job's cancel sets), as a cancel that arrives while Milvus scans the ids."""

    def __init__(self, store, stop: dict | None = None):
        super().__init__(store)
        self.calls, self._stop = [], stop

    def __getattr__(self, name):
        if name in ("ids", "count", "scan", "fetch"):
            def call(*a, **kw):
                self.calls.append(name)
                out = getattr(self._s, name)(*a, **kw)
                if name == "ids" and self._stop is not None:
                    self._stop["asked"] = True
                return out

            return call
        return super().__getattr__(name)


@pytest.mark.parametrize("when", ["before", "during ids"])
def test_a_rows_check_stops_on_a_cancel_before_its_slow_reads(qstore, monkeypatch, when):
    """check_rows read every target id, then counted the source (for the fraction alone: a round trip on Milvus),
    then a first batch before its first report: a cancel at t=0 stopped after 121 s on 200k Milvus Lite rows. A
    cancel asked before the check stops it before any of them; one asked while the ids are read, before the first
    source batch (the space check reads one small batch of the source before); the source is never counted."""
    import service.ops.verify as ov
    from service.vectordb import migrate

    X, Y = _pairs()
    m = align.fit_procrustes(X, Y)
    qstore.create("src", X.shape[1])
    qstore.upsert("src", np.arange(len(X)), X)
    migrate(qstore, "src", "dst", m, batch_size=100)
    stop = {"asked": when == "before"}
    store = _Watched(qstore, stop)
    monkeypatch.setattr(ov, "open_store_for", lambda *a, **kw: store)
    with pytest.raises(Cancelled, match="during 'rows'"):
        ov.run_verify(store_url="qdrant://unused", collection="dst", source="src", map_ref=m,
                      cancelled=lambda: stop["asked"])
    # (the space check's first rows are read before: a source that records no space, one small batch)
    read = store.calls[store.calls.index("ids"):] if "ids" in store.calls else []
    assert read == ([] if when == "before" else ["ids"]) and "count" not in store.calls, store.calls
    stop["asked"] = False
    store.calls.clear()
    ov.run_verify(store_url="qdrant://unused", collection="dst", source="src", map_ref=m, cancelled=lambda: False,
                  progress=lambda s, f: None)
    assert "count" not in store.calls and "ids" in store.calls, store.calls  # the fraction needs no source count


def test_a_reembedding_check_stops_on_a_cancel_asked_while_its_ids_are_read(qstore, monkeypatch):
    """After its "sample" report the re-embed check read every id and fetched the sample before the first
    "embed" report: a cancel asked meanwhile waited for both. It stops before the fetch now."""
    import service.ops.verify as ov

    X, _ = _pairs(n=40, d=384)
    qstore.create("t", 384)
    qstore.upsert("t", np.arange(40), X, [f"t{i}" for i in range(40)])
    stop = {"asked": False}
    store = _Watched(qstore, stop)
    monkeypatch.setattr(ov, "open_store_for", lambda *a, **kw: store)
    with pytest.raises(Cancelled, match="during 'sample'"):
        ov.run_verify(store_url="qdrant://unused", collection="t", encoder="all-MiniLM-L6-v2",
                      cancelled=lambda: stop["asked"])
    assert store.calls == ["ids"], store.calls


def test_an_unreachable_socket_folder_with_a_space_is_hidden_whole(tmp_path):
    """``cannot connect to u@/tmp/my dir/vb: ...`` was masked up to its first space: `` dir/vb`` reached clients."""
    pytest.importorskip("psycopg")
    from urllib.parse import quote

    from service.urls import hide_endpoints
    from service.vectordb.base import pg_connect

    folder = tmp_path / "my dir"
    folder.mkdir()
    with pytest.raises(align.exceptions.VecbridgeError) as e:
        pg_connect(f"postgresql://u@/vb?host={quote(str(folder))}", "pgvector", "start it")
    said = str(e.value)
    assert f"cannot connect to u@{folder}/vb: " in said, said  # the log keeps it
    shown = hide_endpoints(said)
    assert "my dir" not in shown and shown.startswith("pgvector: cannot connect to ***: "), shown
    assert shown.endswith("No such file or directory; start it"), shown  # the driver's words stay
    registry = "cannot connect to PostgreSQL registry: connection refused"
    assert hide_endpoints(registry) == registry  # the registry's line names no place before its ": "


def test_a_registry_outage_while_the_encoder_is_checked_is_a_503(tmp_path, monkeypatch):
    """The space check reads the registry: its database down is the usual 503 (Retry-After), neither a skipped
    check nor a failed one (nothing catches it as "space unknown")."""
    pytest.importorskip("qdrant_client")
    from _servers import seed_registry

    from service.api import create_app
    from service.registry import RegistryUnavailableError
    from service.vectordb import open_store

    url = f"qdrant://{tmp_path / 'qd'}"
    with open_store(url) as s:
        s.create("c", 384)
        s.set_space("c", "a")
        s.upsert("c", np.arange(4), _pairs(n=4, d=384)[0], [f"t{i}" for i in range(4)])
    seed_registry(tmp_path / "data")
    with TestClient(create_app(settings_for(tmp_path, vectordb_url=url))) as c:
        state = c.app.state.vb

        def down(name):
            raise RegistryUnavailableError("cannot connect to PostgreSQL registry: connection refused")

        monkeypatch.setattr(state.registry, "get_space", down)
        r = c.post("/v1/verifications", json={"collection": "c", "encoder": "all-MiniLM-L6-v2"}, headers=W)
        jobs = c.get("/v1/jobs", headers=W).json()
    assert r.status_code == 503 and r.json()["error"]["type"] == "RegistryUnavailableError", r.text
    assert "Retry-After" in r.headers and not jobs.get("jobs", jobs.get("items")), jobs
