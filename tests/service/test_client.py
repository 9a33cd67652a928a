"""``service.client.Client`` against the real service: uvicorn on loopback, a temp data dir holding
spaces ``a``, ``b`` (16-d) and the map ``a2b`` (Procrustes on a planted rotation). Tests marked
``both_clients`` run ``AsyncClient`` too (the same calls: ``service.client_core``)."""

from __future__ import annotations

import asyncio
import copy
import math
import pickle
import time
import warnings

import httpx
import numpy as np
import pytest
from _clients import both_clients
from _servers import seeded_uvicorn, serve_in_thread, tiny_lm_app

from align.exceptions import InputError, NotRepresentableError
from service.client import (
    APIError,
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
    JobCancelledError,
    JobFailedError,
    JobTimeoutError,
    NotFoundError,
    PermissionDeniedError,
    QueueFullError,
    ServerError,
    ServiceUnavailableError,
    UnexpectedResponseError,
    ValidationError,
    error_from_response,
)
from service.client_wire import as_list, matrix

WKEY, RKEY = "wkey-456", "rkey-123"  # test_api_support.KEYS


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with seeded_uvicorn(tmp_path_factory.mktemp("client")) as (url, (X, Y, m)):
        yield url, X, Y, m


@pytest.fixture
def vb(server, client_cls):
    with client_cls(server[0], api_key=WKEY, page_size=2) as c:
        yield c


# --- maps and transform -------------------------------------------------------------------------
def test_maps_versions_aliases(vb):
    assert "a2b" in [m["name"] for m in vb.list_maps()]
    assert {s["name"] for s in vb.list_spaces()} >= {"a", "b"}
    assert vb.get_map("a2b")["resolved"]["version"] == 1
    assert [v["version"] for v in vb.list_versions("a2b")] == [1]
    assert vb.set_alias("a2b", "prod", 1)["aliases"] == ["prod"]
    assert vb.get_map("a2b@prod")["resolved"]["version"] == 1
    vb.delete_alias("a2b", "prod")
    with pytest.raises(NotFoundError):
        vb.get_map("a2b@prod")


@both_clients
def test_a_version_that_is_not_an_integer_is_refused_before_sending(vb):
    """``int(version)`` truncated: set_alias("a2b", "prod", 1.7) pointed prod at version 1 and get_version("a2b",
    1.7) answered version 1; True was version 1 too."""
    for bad in (1.7, 1.0, True, "1.7", None):
        calls = [("set_alias", "a2b", "tmp", bad), ("get_version", "a2b", bad), ("set_tag", "a2b", bad, "k", "v"),
                 ("delete_version", "a2b", bad), ("set_steer_alias", "s", "tmp", bad)]
        for method, *args in calls:
            with pytest.raises(InputError, match="must be an integer version number"):
                getattr(vb, method)(*args)
        if bad is not None:  # expected=None: no condition
            with pytest.raises(InputError, match="expected must be an integer version number"):
                vb.delete_alias("a2b", "tmp", expected=bad)
            with pytest.raises(InputError, match="expected must be an integer version number"):
                vb.set_alias("a2b", "tmp", 1, expected=bad)
    with pytest.raises(NotFoundError):
        vb.get_map("a2b@tmp")  # nothing was sent
    assert vb.get_version("a2b", np.int64(1))["version"] == vb.get_version("a2b", "1")["version"] == 1
    assert vb.set_alias("a2b", "tmp", "1", expected=0)["aliases"] == ["tmp"]
    vb.delete_alias("a2b", "tmp", expected=np.int64(1))


def test_a_space_is_deleted_over_http_only_while_unused(vb, server):
    """DELETE /v1/spaces/{name}: the space as it was; 409 naming the map or the index in it; 404 after."""
    _, X, _, _ = server
    vb.create_space("tmp-space", 16, description="to go")
    vb.create_index("in-tmp", "tmp-space", X[:5])
    with pytest.raises(ConflictError, match="space 'tmp-space' is used by index 'in-tmp'"):
        vb.delete_space("tmp-space")
    vb.drop_index("in-tmp")
    assert vb.delete_space("tmp-space")["description"] == "to go"
    assert "tmp-space" not in {s["name"] for s in vb.list_spaces()}
    with pytest.raises(NotFoundError):
        vb.delete_space("tmp-space")
    with pytest.raises(ConflictError, match="used by map 'a2b'"):
        vb.delete_space("a")


def test_models_list_and_one_by_name(vb):
    listed = vb.list_models()
    assert {m["id"] for m in listed} >= {"all-MiniLM-L6-v2", "multilingual-e5-small"}
    assert vb.get_model("minilm") == next(m for m in listed if m["id"] == "all-MiniLM-L6-v2")
    with pytest.raises(NotFoundError, match="unknown encoder 'nosuch'"):
        vb.get_model("nosuch")


@both_clients
def test_tag_writes_take_the_version_etag_and_answer_the_new_one(vb):
    """A tag write honours ``If-Match`` (412 when the version changed since it was read), but the client had no way
    to send it, nor to read the version's ETag, and its 412 said only "an alias moved". ``get_version``, ``set_tag``
    and ``delete_tag`` now answer the record with its ``.etag``, and the writes take ``etag=``."""
    from service.client import PreconditionFailedError, VersionRecord

    v = vb.get_version("a2b", 1)
    assert isinstance(v, VersionRecord) and v.etag and v.etag.startswith('"') and v["version"] == 1
    r = vb.set_tag("a2b", 1, "etag-owner", "search", etag=v.etag)
    assert r["tags"]["etag-owner"] == "search" and r.etag not in (None, v.etag)
    assert r.etag == vb.get_version("a2b", 1).etag  # the ETag a read answers now
    with pytest.raises(PreconditionFailedError, match="does not hold") as err:  # written since v was read
        vb.set_tag("a2b", 1, "etag-owner", "ranking", etag=v.etag)
    assert err.value.status == 412 and "version changed" in type(err.value).__doc__
    with pytest.raises(PreconditionFailedError):
        vb.delete_tag("a2b", 1, "etag-owner", etag=v.etag)
    assert vb.get_version("a2b", 1)["tags"]["etag-owner"] == "search"  # nothing written
    gone = vb.delete_tag("a2b", 1, "etag-owner", etag=r.etag)
    assert "etag-owner" not in gone["tags"] and gone.etag == vb.get_version("a2b", 1).etag
    assert vb.set_tag("a2b", 1, "etag-owner", 1)["tags"]["etag-owner"] == "1"  # without etag=: as before
    vb.delete_tag("a2b", 1, "etag-owner")
    for bad in (7, "", 'x"\n'):
        with pytest.raises(InputError, match="etag must be"):
            vb.set_tag("a2b", 1, "etag-owner", "x", etag=bad)


@both_clients
def test_fit_sends_the_unpaired_rows_as_post_v1_fits_takes_them(vb, server, client_kind):
    """README step 2: POST /v1/fits takes ``unpaired_source`` / ``unpaired_target``; the client's ``fit()`` had no
    way to send them (a TypeError). Sent as base64 float32, as the sides are; the server's refusals name them."""
    _, X, Y, _ = server
    name, a, b = f"unpaired-{client_kind}", f"ua-{client_kind}", f"ub-{client_kind}"  # spaces of their own: no
    # other test's search may take this map for a path
    fit = {"method": "auto", "paired": True, "params": {"candidates": ["procrustes"]}}
    job = vb.wait(vb.fit(name, a, b, X[:100], Y[:100], unpaired_source=X[100:], unpaired_target=Y[150:],
                         **fit)["id"], timeout=120)
    assert job["state"] == "succeeded", job
    inputs = vb.get_version(name, 1)["inputs"]
    assert inputs["n_unpaired_source"] == 200 and inputs["n_unpaired_target"] == 150, inputs
    with pytest.raises(ValidationError, match="unpaired_source.vectors: rows of 8 columns"):
        vb.fit(name, a, b, X[:100], Y[:100], unpaired_source=X[100:, :8], **fit)
    with pytest.raises(ValidationError, match="unpaired_target: the unpaired rows apply to method auto"):
        vb.fit(name, a, b, X[:100], Y[:100], unpaired_target=Y[150:], method="procrustes", paired=True)


def test_tags_artifact_and_soft_delete(vb, server):
    from align import LinearMap

    _, X, _, m = server
    job = vb.wait(vb.fit("del-me", "a", "b", X, m.apply(X, output="raw"), method="procrustes", paired=True)["id"])
    assert vb.set_tag("del-me", 1, "owner", "search-team")["tags"]["owner"] == "search-team"
    assert vb.set_tag("del-me", 1, "team", "x")["tags"] == {"owner": "search-team", "team": "x"}
    assert vb.delete_tag("del-me", 1, "team")["tags"] == {"owner": "search-team"}
    with pytest.raises(NotFoundError, match="has no tag 'team'"):  # a retried delete: gone already (404, as the CLI)
        vb.delete_tag("del-me", 1, "team")
    with pytest.raises(NotFoundError):
        vb.delete_tag("del-me", 9, "team")
    for fmt in ("safetensors", "npz"):
        got = LinearMap.from_bytes(vb.download_artifact("del-me:1", format=fmt))
        np.testing.assert_allclose(got.apply(X[:3], output="raw"), vb.transform("del-me", X[:3]), atol=1e-5)
    assert vb.delete_version("del-me", 1)["deleted"] and job["result"]["ref"] == "del-me:1"
    with pytest.raises(NotFoundError):
        vb.transform("del-me:1", X[:1])
    assert [v["deleted"] for v in vb.list_versions("del-me")] == [True]


@both_clients
def test_transform_binary_json_npy_agree_with_the_map(vb, server):
    _, X, _, m = server
    want = m.apply(X, output="raw")
    fast = vb.transform("a2b", X)
    assert fast.dtype == np.float32 and fast.shape == want.shape
    np.testing.assert_allclose(fast, want, atol=1e-5)
    np.testing.assert_allclose(vb.transform("a2b", X[:7], binary=False), want[:7], atol=1e-5)
    np.testing.assert_allclose(vb.transform_npy("a2b", X[:5].astype(np.float64)), want[:5], atol=1e-5)
    np.testing.assert_allclose(vb.transform("a2b", X[0]), want[:1], atol=1e-5)  # one row as 1-D
    frame = vb.transform("a2b", X[:5], output="frame")
    np.testing.assert_allclose(frame, m.apply(X[:5], output="frame"), atol=1e-5)


# --- asyncio: AsyncClient in an event loop -------------------------------------------------------
def test_async_client_runs_calls_concurrently_and_closes_with_async_with(server):
    _, X, _, m = server
    want = m.apply(X, output="raw")

    async def main():
        async with AsyncClient(server[0], api_key=WKEY, page_size=2) as vb:
            *parts, maps, missing = await asyncio.gather(
                *(vb.transform("a2b", X[i::4], binary=i % 2 == 0) for i in range(4)), vb.list_maps(),
                vb.get_map("nope"), return_exceptions=True)
        return parts, maps, missing, vb

    parts, maps, missing, vb = asyncio.run(main())
    for i, Y in enumerate(parts):
        np.testing.assert_allclose(Y, want[i::4], atol=1e-5)
    assert "a2b" in [mp["name"] for mp in maps]
    assert isinstance(missing, NotFoundError) and missing.status == 404 and missing.request_id
    assert vb._http.is_closed  # `async with` released the connections


# --- typed errors -------------------------------------------------------------------------------
@both_clients
def test_errors_are_typed_with_message_and_request_id(vb, server, client_cls):
    with pytest.raises(NotFoundError) as e:
        vb.transform("nope", np.zeros((2, 16)))
    assert e.value.status == 404 and "nope" in e.value.message and e.value.request_id
    with pytest.raises(ValidationError) as e:
        vb.transform("a2b", np.zeros((2, 3)))  # 3 columns for a 16-d map
    assert e.value.type == "DimensionMismatchError" and "16" in e.value.message
    with pytest.raises(ValidationError):
        vb.transform("a2b", np.full((2, 16), np.nan), binary=False)
    with pytest.raises(ConflictError):
        vb.create_space("a", 8)  # space a is 16-d
    with client_cls(server[0]) as anon, pytest.raises(AuthenticationError):
        anon.list_maps()
    with client_cls(server[0], api_key=RKEY) as reader, pytest.raises(PermissionDeniedError):
        reader.create_space("zz", 4)
    assert isinstance(e.value, APIError) and str(e.value).startswith("422 ")


def test_errors_survive_pickling_to_another_process(vb):
    """An :class:`APIError` or :class:`JobError` raised in a ``ProcessPoolExecutor`` / ``multiprocessing`` worker
    travels to the parent by pickle, which rebuilt it as ``cls(*args)``: their ``__init__`` takes other arguments
    (status, type, message ... / the job record), so unpickling raised TypeError in the parent and the pool broke
    (``BrokenProcessPool``) instead of the caller seeing the NotFoundError. They pickle whole now."""
    with pytest.raises(NotFoundError) as nf:
        vb.get_map("no-such-map")
    bad = vb.fit("degenerate", "a", "b", np.ones((5, 16)), np.ones((5, 16)), method="procrustes", paired=True)
    with pytest.raises(JobFailedError) as failed:
        vb.wait(bad["id"], timeout=120)
    busy = QueueFullError(429, "QueueFullError", "the job queue is full", "rid", {}, retry_after=2.5)
    busy.args = (f"{busy.args[0]} (gave up after 3 tries)",)  # as _request adds why it ends here
    busy.added_ids = [1, 2]  # as add() adds after a later batch failed
    for err in (nf.value, failed.value, busy, JobTimeoutError({"id": "j", "state": "running"}, 3.0)):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__
    assert nf.value.request_id and pickle.loads(pickle.dumps(nf.value)).status == 404
    assert copy.deepcopy(busy).retry_after == 2.5


@pytest.mark.parametrize("status,cls", [(404, NotFoundError), (422, ValidationError), (429, QueueFullError),
                                        (503, ServiceUnavailableError), (500, ServerError), (418, APIError)])
def test_error_class_per_status(status, cls):
    r = httpx.Response(status, json={"error": {"type": "X", "status": status, "message": "m"}},
                       headers={"x-request-id": "rid", "retry-after": "5"})
    err = error_from_response(r)
    assert type(err) is cls and (err.message, err.type, err.request_id) == ("m", "X", "rid")
    assert err.retry_after == 5.0
    plain = error_from_response(httpx.Response(status, text="not json"))
    assert type(plain) is cls and plain.message == "not json"


@both_clients
def test_a_redirect_is_an_error_not_an_empty_success(vb, server, client_cls, client_kind):
    """A front that redirects (http -> https, a moved host or path; 3xx, empty body) was taken for a success: the
    client follows no redirect, and a 3xx was under 400, so ``drop_index`` and ``delete_alias`` returned None as if
    done, ``create_index`` and ``info`` returned None, while the service never saw them. A 3xx now raises
    :class:`UnexpectedResponseError` naming where it points; nothing was done there."""
    from starlette.applications import Starlette
    from starlette.responses import RedirectResponse
    from starlette.routing import Route

    async def moved(request):
        return RedirectResponse(server[0] + request.url.path.removeprefix("/old"), status_code=308)

    front = Starlette(routes=[Route("/old/{path:path}", moved, methods=["GET", "POST", "PUT", "DELETE"])])
    kept = f"behind-a-redirect-{client_kind}"
    vb.create_index(kept, "b")
    with serve_in_thread(front) as url, client_cls(url + "/old", api_key=WKEY) as moved_vb:
        for call in (moved_vb.info, lambda: moved_vb.create_index("never-made", "b"),
                     lambda: moved_vb.drop_index(kept), lambda: moved_vb.delete_alias("a2b", "x")):
            with pytest.raises(UnexpectedResponseError, match="redirected to '" + server[0]) as e:
                call()
            assert e.value.status == 308 and "nothing was done" in str(e.value)
    assert vb.get_index(kept)["name"] == kept  # not dropped: the service never saw the DELETE
    with pytest.raises(NotFoundError):
        vb.get_index("never-made")
    vb.drop_index(kept)


# --- indexes ------------------------------------------------------------------------------------
@both_clients
def test_index_create_add_search_delete(vb, server):
    _, X, Y, _ = server
    info = vb.create_index("ib", "b", Y[:200], payloads=[{"row": i} for i in range(200)])
    assert info["count"] == 200 and info["space"] == "b"
    added = vb.add("ib", Y[200:], ids=range(200, len(Y)))
    assert added["count"] == len(Y) and added["ids"][0] == 200
    hits = vb.search("ib", X[:20], space="a", k=3)  # queries from space a, through a2b
    assert [row[0]["id"] for row in hits["results"]] == list(range(20))
    assert hits["maps"][0]["name"] == "a2b" and hits["results"][0][0]["payload"] == {"row": 0}
    assert vb.delete_ids("ib", [0, 1])["count"] == len(Y) - 2
    top = [row[0]["id"] for row in vb.search("ib", Y[:2], k=1)["results"]]
    assert 0 not in top and 1 not in top
    assert "ib" in {i["name"] for i in vb.list_indexes()}
    vb.drop_index("ib")
    with pytest.raises(NotFoundError):
        vb.get_index("ib")


def test_ivf_train_rows_round_trips_and_nonsense_is_a_422(vb, server):
    """``params={"train_rows": N}`` over HTTP: the k-means sample of an IVF index, answered back in its params (and
    64 x nlist when not given); below nlist, above 256 x nlist or not an integer: 422 naming it. Before: unknown."""
    _, _, Y, _ = server
    info = vb.create_index("ivt", "b", Y, kind="ivf", params={"nlist": 4, "train_rows": 100})
    assert info["params"]["train_rows"] == 100 and vb.get_index("ivt")["params"]["train_rows"] == 100
    assert vb.create_index("ivd", "b", Y, kind="ivf", params={"nlist": 4})["params"]["train_rows"] == 256
    for value, message in ((3, "below nlist=4"), (1025, "exceeds 256 x nlist = 1024"), ("100", "must be an integer")):
        with pytest.raises(ValidationError, match=message) as err:
            vb.create_index("ivbad", "b", Y, kind="ivf", params={"nlist": 4, "train_rows": value})
        assert err.value.status == 422
    with pytest.raises(NotFoundError):
        vb.get_index("ivbad")
    vb.drop_index("ivt")
    vb.drop_index("ivd")


# --- fits and jobs ------------------------------------------------------------------------------
@both_clients
def test_fit_wait_progress_cancel_and_counts(vb, server, client_kind):
    _, X, Y, m = server
    sup_name = f"a2b-sup-{client_kind}"
    slow = vb.fit("a2b-first", "a", "b", X, Y, method="procrustes", paired=True)  # keeps the one worker busy
    queued = vb.fit(sup_name, "a", "b", X, Y, method="procrustes", paired=True)  # waits: one worker
    cancelled = vb.cancel(queued["id"])
    assert cancelled["cancel_requested"]
    with pytest.raises(JobCancelledError) as e:
        vb.wait(queued["id"], timeout=60)
    assert e.value.job["state"] == "cancelled"
    seen = []
    done = vb.wait(slow["id"], timeout=300, progress=seen.append)
    assert done["state"] == "succeeded" and seen[-1]["state"] == "succeeded"
    assert len({(j["progress"]["stage"], j["progress"]["fraction"]) for j in seen}) == len(seen)  # changes only
    # timeout=None waits as long as it takes (it was a TypeError)
    sup = vb.wait(vb.fit(sup_name, "a", "b", X, Y, method="procrustes", paired=True)["id"], timeout=None)
    assert sup["result"]["ref"] == f"{sup_name}:1"
    np.testing.assert_allclose(vb.transform(sup_name, X[:4]), m.apply(X[:4], output="raw"), atol=1e-4)
    jobs = vb.list_jobs()  # page_size 2: several pages, in creation order
    assert [j["id"] for j in jobs][-3:] == [slow["id"], queued["id"], sup["id"]] and len(jobs) > 2
    counts = vb.job_counts()
    for state in ("succeeded", "cancelled"):
        assert counts[state] == sum(j["state"] == state for j in jobs) > 0


# --- steers -------------------------------------------------------------------------------------
def test_steer_fit_and_apply(vb):
    rng = np.random.default_rng(0)
    V = rng.standard_normal((120, 16)).astype(np.float32)
    labels = np.where(V[:, 0] > 0, 1, -1)
    fit = vb.fit_steer("up", "b", labels, V, params={"method": "lm-steer", "rank": 2, "max_iter": 50})
    job = vb.wait(fit["id"], timeout=120)
    assert job["result"]["ref"] == "up:1" and vb.get_steer("up")["space"] == "b"
    Q = V[:5]
    np.testing.assert_allclose(vb.apply_steer("up", Q, eps=0.0), Q, atol=1e-6)
    d1 = vb.apply_steer("up", Q, eps=1.0) - Q
    d2 = vb.apply_steer("up", Q, eps=2.0) - Q
    assert np.abs(d1).max() > 1e-4
    np.testing.assert_allclose(d2, 2 * d1, atol=1e-4)  # Q (I + eps W) is linear in eps
    assert [s["name"] for s in vb.list_steers()] == ["up"]
    with pytest.raises(ValidationError, match="a local steer is rank 1"):
        vb.fit_steer("up", "b", labels, V, params={"rank": 8})  # was a job: params said rank 8, the steer rank 1


def test_a_steer_strength_that_is_not_a_number_is_refused_before_sending(vb):
    """``apply_steer(ref, Q, eps=True)`` sent 1.0 (``float(True)``; the string "1" too), where the service refuses
    a bool: the steer applied at full strength. Now an InputError before a request goes out (a steer that does not
    exist answered 404 after the request)."""
    Q = np.zeros((2, 16), np.float32)
    for bad in (True, np.bool_(False), "1", float("nan")):
        with pytest.raises(InputError, match="eps must be a finite number"):
            vb.apply_steer("no-such-steer", Q, eps=bad)


@both_clients
def test_a_steer_transfer_without_a_name_lands_as_name_dash_target_space(vb, client_kind):
    """``transfer_steer(ref, map)`` defaulted the name to the source steer's, which is bound to the source space:
    over a map into another space it always failed with 409 ("steer 'x' lives in space 'a', not 'b'"). The default
    is now ``{name}-{target space}``; a default over 128 characters is a 422 asking for ``name``."""
    V = np.random.default_rng(3).standard_normal((120, 16)).astype(np.float32)
    labels = np.where(V[:, 0] > 0, 1, -1)
    for name in (f"tr-{client_kind}", "y" * 127):
        vb.wait(vb.fit_steer(name, "a", labels, V, params={"method": "lm-steer", "rank": 2, "max_iter": 20})["id"],
                timeout=120)
    moved = vb.transfer_steer(f"tr-{client_kind}", "a2b")
    assert (moved["name"], moved["space"], moved["version"]) == (f"tr-{client_kind}-b", "b", 1)
    assert vb.get_steer(f"tr-{client_kind}-b")["inputs"]["steer"] == f"tr-{client_kind}:1"
    with pytest.raises(ValidationError, match="has 129 characters, over 128: give the transferred steer a name"):
        vb.transfer_steer("y" * 127, "a2b")
    assert vb.transfer_steer("y" * 127, "a2b", name=f"y-{client_kind}")["space"] == "b"


@both_clients
def test_a_steer_alias_is_read_and_removed(vb, client_kind):
    """The client could set a steer alias but neither read nor remove one (GET and DELETE
    /v1/steers/{name}/aliases/{alias} exist, with If-Match; the CLI has `steer alias NAME ALIAS --delete`)."""
    from service.client import PreconditionFailedError

    V = np.random.default_rng(2).standard_normal((40, 16)).astype(np.float32)
    labels, name = np.where(V[:, 0] > 0, 1, -1), f"pin-{client_kind}"
    for _ in range(2):
        vb.wait(vb.fit_steer(name, "b", labels, V, params={"method": "mean-shift"})["id"], timeout=120)
    vb.set_steer_alias(name, "prod", 1)
    assert vb.get_steer_alias(name, "prod") == {"name": name, "alias": "prod", "version": 1}
    with pytest.raises(PreconditionFailedError):
        vb.delete_steer_alias(name, "prod", expected=2)  # it points at 1: nothing removed
    assert vb.get_steer(name)["version"] == 1
    vb.delete_steer_alias(name, "prod", expected=1)
    assert vb.get_steer(name)["version"] == 2  # released: the newest live version
    for call in (lambda: vb.get_steer_alias(name, "prod"), lambda: vb.delete_steer_alias(name, "prod")):
        with pytest.raises(NotFoundError):
            call()


@both_clients
def test_a_steers_versions_are_listed_with_their_verdicts_and_aliases(vb, server, client_kind):
    """Maps have GET /v1/maps/{name}/versions; a steer's versions could only be read one at a time (GET
    /v1/steers/NAME:N, a 404 for a deleted one), so no client could see which were flagged unreliable, deleted or held
    by an alias. Now GET /v1/steers/{name}/versions: each version as the detail route shows it (aliases, verdict),
    paged and filtered as the maps route, 404 naming an unknown steer; ``Client.list_steer_versions``."""
    rng = np.random.default_rng(0)
    V = rng.standard_normal((3000, 16)).astype(np.float32)
    name = f"vers-{client_kind}"  # local steers: v1 separates its labels, v2 (random labels) does not, v3 does
    for labels in (np.where(V[:, 0] > 0, 1, -1), rng.choice([-1, 1], len(V)), np.where(V[:, 1] > 0, 1, -1)):
        assert vb.wait(vb.fit_steer(name, "b", labels, V)["id"], timeout=120)["state"] == "succeeded"
    vb.set_steer_alias(name, "prod", 1)
    vb.set_steer_alias(name, "canary", 2)
    live = {v: vb.get_steer(f"{name}:{v}") for v in (1, 2)}
    vb.delete_steer_version(name, 3)
    got = vb.list_steer_versions(name)  # page_size=2: two pages
    assert [v["version"] for v in got] == [1, 2, 3] and [v["deleted"] for v in got] == [False, False, True]
    assert got[0] == live[1] and got[1] == live[2]  # the detail route's record, verdict and aliases included
    assert [v["aliases"] for v in got] == [["prod"], ["canary"], []]
    assert [v["metrics"]["reliable"] for v in got] == [True, False, True]
    assert "found no gain from its labels" in got[1]["metrics"]["unreliable_reason"]
    assert got[0]["metrics"]["heldout_loss_ratio"] < 0.8 < got[1]["metrics"]["heldout_loss_ratio"]
    assert [v["version"] for v in vb.list_steer_versions(name, include_deleted=False)] == [1, 2]
    with pytest.raises(NotFoundError, match="nope-steer"):
        vb.list_steer_versions("nope-steer")
    with httpx.Client(base_url=server[0], headers={"Authorization": f"Bearer {RKEY}"}) as c:
        first = c.get(f"/v1/steers/{name}/versions", params={"limit": 2})
        assert first.status_code == 200 and [v["version"] for v in first.json()["data"]] == [1, 2]
        rest = c.get(f"/v1/steers/{name}/versions", params={"limit": 2, "cursor": first.json()["next"]}).json()
        assert [v["version"] for v in rest["data"]] == [3] and rest["next"] is None
        for kind, unknown in (("steers", "nope-steer"), ("maps", "nope-map")):  # the same 404 as the maps route
            r = c.get(f"/v1/{kind}/{unknown}/versions")
            assert r.status_code == 404 and unknown in r.json()["error"]["message"], r.text
            assert r.json()["error"]["type"] == "NotFoundError" and r.json()["error"]["status"] == 404


@both_clients
def test_one_string_is_one_text_not_one_per_character(vb):
    """``embed("hello", model)`` sent ``list("hello")``: five one-character texts, five embeddings returned without a
    word (the service takes one string as one text, as OpenAI's API does). One string is one text now, for every
    ``texts`` argument (``as_list``)."""
    one = vb.embed("hello", "all-MiniLM-L6-v2")
    assert one.shape == (1, 384)
    np.testing.assert_array_equal(one, vb.embed(["hello"], "all-MiniLM-L6-v2"))
    assert as_list("a dog") == ["a dog"] and as_list(("a", "b")) == ["a", "b"] and as_list(None) is None


# --- pagination through the client and raw ------------------------------------------------------
@both_clients
def test_list_pages_follow_next(vb, server, client_cls, client_kind):
    for name in ("p1", "p2", "p3"):
        vb.create_space(f"{name}-{client_kind}", 4)
    with client_cls(server[0], api_key=WKEY, page_size=500) as big:
        assert vb.list_spaces() == big.list_spaces()  # pages of 2 == one page of 500
    first = vb.request("GET", "/v1/spaces", params={"limit": 2}).json()
    assert len(first["data"]) == 2 and first["next"]
    unpaged = vb.request("GET", "/v1/spaces").json()
    assert unpaged["next"] is None and len(unpaged["data"]) == len(vb.list_spaces())
    with pytest.raises(ValidationError):
        vb.request("GET", "/v1/spaces", params={"cursor": "%%%"})


# --- the language model routes (a tiny random Llama served by uvicorn in this process) -----------
@pytest.fixture(scope="module")
def lm_server(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from service.limits import Limits

    app = tiny_lm_app(tmp_path_factory.mktemp("client-lm"), limits=Limits(lm_max_new_tokens=20))
    with serve_in_thread(app) as base:
        yield base


def test_lm_steer_generate_analyze(lm_server):
    pos = ["the film was good", "a great movie", "really great actors", "a very good plot"]
    neg = ["the film was bad", "an awful movie", "really awful actors", "a very dull plot"]
    with Client(lm_server, api_key=WKEY) as vb:
        job = vb.wait(vb.lm_fit_steer("tone", pos + neg, [1] * 4 + [-1] * 4, rank=2, eps=1.0, steps=20,
                                      lr=0.05)["id"], timeout=120)
        assert job["result"]["ref"] == "tone:1"
        plain = vb.lm_generate("the film", max_new_tokens=5)
        again = vb.lm_generate("the film", max_new_tokens=5)
        assert plain["text"] == again["text"] and plain["steers"] == []  # seeded: deterministic
        steered = vb.lm_generate("the film", {"tone": 50.0}, max_new_tokens=5)
        assert steered["steers"] == [{"name": "tone", "version": 1, "eps": 50.0}]
        ev = vb.lm_analyze("the film was good", "tone")
        assert ev["steer"] == "tone:1" and len(ev["tokens"]) >= 1
        with pytest.raises(NotFoundError):
            vb.lm_generate("x", {"missing": 1.0})


def test_lm_generate_defaults_are_the_services(lm_server):
    """``lm_generate`` decoded greedily by default (it sent temperature 0.0) where POST /v1/lm/generate and
    ``vecbridge lm generate`` sample at 1.0, and it sent max_new_tokens=30 where the service's default is capped by
    ``limits.lm_max_new_tokens`` (here 20: a 422). It now sends only what it is given."""
    with Client(lm_server, api_key=WKEY) as vb:
        raw = vb.request("POST", "/v1/lm/generate", json={"prompt": "the film"}).json()["text"]
        default = vb.lm_generate("the film")["text"]
        assert default == raw  # the old client sent max_new_tokens=30: a 422 against this limit of 20
        assert default != vb.lm_generate("the film", temperature=0.0)["text"]  # greedy only when asked
        assert vb.lm_generate("the film", max_new_tokens=3, temperature=0.0) == vb.request(
            "POST", "/v1/lm/generate", json={"prompt": "the film", "max_new_tokens": 3, "temperature": 0}).json()


# --- names are path segments, never paths -------------------------------------------------------
def test_a_name_cannot_reach_another_route(vb, server):
    _, X, Y, _ = server
    vb.create_index("keep-me", "b", Y[:10])
    vb.set_alias("a2b", "live", 1)
    for call in (lambda: vb.delete_alias("a2b", "../../../indexes/keep-me"),  # was DELETE /v1/indexes/keep-me
                 lambda: vb.get_map("../spaces"), lambda: vb.transform("a2b/x", X[:1]),
                 lambda: vb.get_job(".."), lambda: vb.drop_index("")):
        with pytest.raises(InputError):
            call()
    assert vb.get_index("keep-me")["count"] == 10 and vb.get_map("a2b@live")["resolved"]["version"] == 1
    with pytest.raises(ValidationError) as e:  # '?' and '#' are part of the name the service judges
        vb.transform("a2b?output=frame", X[:1])
    assert "a2b?output=frame" in e.value.message
    with pytest.raises(NotFoundError):
        vb.get_map("x->y")
    vb.drop_index("keep-me")
    vb.delete_alias("a2b", "live")


# --- numbers from numpy, arrays back ------------------------------------------------------------
def test_numpy_ids_numbers_and_payloads_are_sent_as_json(vb, server):
    Y = server[2]
    vb.create_index("np-ids", "b", Y[:4], ids=np.arange(100, 104), payloads=[{"w": np.float32(0.5)}] * 4)
    added = vb.add("np-ids", Y[4:8], ids=np.array([7, 8, 9, 10], dtype=np.int32))
    assert added["ids"] == [7, 8, 9, 10] and added["count"] == 8
    hits = vb.search("np-ids", Y[:1], k=np.int64(3))["results"][0]
    assert hits[0]["id"] == 100 and type(hits[0]["id"]) is int and hits[0]["payload"] == {"w": 0.5}
    assert vb.delete_ids("np-ids", np.array([100]))["count"] == 7
    with pytest.raises(InputError):  # NaN is no JSON: refused here, nothing sent
        vb.add("np-ids", Y[8:9], ids=[11], payloads=[{"w": float("nan")}])
    assert vb.get_index("np-ids")["count"] == 7
    vb.drop_index("np-ids")


def test_vectors_come_back_exact_and_writeable(vb, server):
    _, X, _, m = server
    binary, as_json = vb.transform("a2b", X), vb.transform("a2b", X, binary=False)
    assert np.array_equal(binary.view(np.uint32), as_json.view(np.uint32))  # the same float32 bits both ways
    np.testing.assert_allclose(binary, m.apply(X, output="raw"), atol=1e-5)
    for Y in (binary, as_json, vb.transform_npy("a2b", X[:3])):
        Y /= np.linalg.norm(Y, axis=1, keepdims=True)  # in place, as users normalise
        np.testing.assert_allclose(np.linalg.norm(Y, axis=1), 1.0, atol=1e-5)


@both_clients
def test_complex_vectors_are_refused_as_the_service_refuses_them(vb, server):
    """Complex rows were cast to float32 with only a ComplexWarning: ``transform`` returned the map of their real
    parts, silently wrong, while ``transform_npy`` (the service's own check) refused them with a 422. The client
    refuses them now, before anything is sent."""
    _, X, _, _ = server
    Z = X[:2] * (1 + 1j)
    for send in (lambda: vb.transform("a2b", Z), lambda: vb.transform("a2b", Z, binary=False),
                 lambda: vb.search("any-index", Z, k=1), lambda: vb.fit("complex", "a", "b", Z, Z)):
        with pytest.raises(InputError, match="complex"):
            send()
    with pytest.raises(ValidationError, match="complex"):
        vb.transform_npy("a2b", Z)


def test_float64_beyond_float32_is_refused_before_sending(vb, server):
    _, X, _, _ = server
    big = X[:3].astype(np.float64)
    big[1, 4] = 1e39  # finite in float64, Inf once cast: the service would have called it NaN/Inf
    with pytest.raises(NotRepresentableError, match="row 1"):
        vb.transform("a2b", big)
    with pytest.raises(ValidationError):  # NaN itself stays the service's to refuse
        vb.transform("a2b", np.full((1, 16), np.nan))


@both_clients
def test_a_503_no_retry_can_fix_is_raised_at_once(vb):
    """A service without a vector database answered every collection route 503 with Retry-After: 5, so the client
    waited 10 s over two retries before raising what no retry could change."""
    t0 = time.monotonic()
    for call in (lambda: vb.search_collection("docs", np.ones((1, 16)), space="a"),
                 lambda: vb.migrate("docs", "docs-b", "a2b")):
        with pytest.raises(ServiceUnavailableError, match="no vector database configured") as err:
            call()
        assert err.value.retry_after is None
    assert time.monotonic() - t0 < 3


def test_float64_near_float32s_range_is_sent_without_a_warning():
    """Values near ±2e38 (within float32's range) raised "RuntimeWarning: overflow encountered in scalar subtract"
    in the client's range check (max - min overflowed), an error under -W error."""
    X = np.zeros((2, 16))
    X[0, 0], X[1, 0] = 2e38, -2e38
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert matrix(X).dtype == np.float32 and np.isfinite(matrix(X)).all()
    with pytest.raises(NotRepresentableError, match="row 1"):  # beyond float32 is still refused
        matrix(np.vstack([X, 1e39 * np.ones((1, 16))])[1:])


def test_float64_rows_below_float32_are_refused_as_the_service_and_linearmap_refuse_them(vb, server):
    """Non-zero float64 rows whose every value is below float32's smallest subnormal were sent as all-zero rows
    (a transform of zeros, silently), where the service's .npy path and LinearMap.apply refuse them."""
    _, X, _, m = server
    tiny = X[:4].astype(np.float64)
    tiny[2] *= 1e-46
    for send in (lambda: vb.transform("a2b", tiny), lambda: vb.transform("a2b", tiny, binary=False),
                 lambda: vb.search("any-index", tiny, k=1), lambda: m.apply(tiny)):
        with pytest.raises(NotRepresentableError, match="1 non-zero row.*all-zero rows"):
            send()
    with pytest.raises(ValidationError, match="all-zero rows"):
        vb.transform_npy("a2b", tiny)
    with pytest.raises(ValidationError, match=r"1 all-zero row\(s\) \(row 0\)"):  # zeros are sent as zeros, and
        vb.transform("a2b", np.zeros((1, 16)))  # the service refuses them by row (the map gave them its offset)


@both_clients
def test_empty_arrays_get_the_services_422_on_every_json_route(vb):
    """An empty (0, d) array sent as JSON (``vectors_b64``) crashed in the client with a bare TypeError ("memoryview:
    cannot cast view with zeros in shape or strides") on transform(binary=False), add, search, create_index, fit,
    apply_steer ... (``client_wire.b64``), while the binary transform got the service's clear 422; now they all do."""
    empty = np.zeros((0, 16), np.float32)
    calls = {"transform json": lambda: vb.transform("a2b", empty, binary=False),
             "transform binary": lambda: vb.transform("a2b", empty),
             "create_index": lambda: vb.create_index("empty-ix", "b", empty),
             "fit": lambda: vb.fit("empty-fit", "a", "b", empty, empty, method="procrustes", paired=True)}
    for what, send in calls.items():
        with pytest.raises(ValidationError, match="EmptyInputError") as e:
            send()
        assert e.value.status == 422, what
    vb.create_index("ix-for-empty", "b")
    for send in (lambda: vb.add("ix-for-empty", empty), lambda: vb.search("ix-for-empty", empty, k=3)):
        with pytest.raises(ValidationError, match="EmptyInputError"):
            send()
    vb.drop_index("ix-for-empty")


# --- every route of the README has its method ---------------------------------------------------
def test_plan_evaluate_report_and_steer_versions(vb, server):
    _, X, Y, _ = server
    plan = vb.plan(X, X[:200], Y[:200], random_state=0)
    assert plan["recommended"]["method"] and plan["alignability"] > 0.4  # a planted rotation aligns
    ev = vb.evaluate("a2b", X[:100], Y[:100], min_top1=0.9)
    assert ev["result"] == "PASS" and ev["top1"] > 0.9
    assert vb.evaluate("a2b", X[:100], Y[::-1][:100], min_top1=0.9)["result"] == "FAIL"  # a verdict, not an error
    with pytest.raises(NotFoundError):
        vb.report("a2b", 1)  # registered without a fit: no report
    done = vb.wait(vb.fit("a2b-rep", "a", "b", X, Y, method="procrustes", paired=True)["id"], timeout=120)
    assert "<html" in vb.report("a2b-rep", 1).lower() and done["result"]["ref"] == "a2b-rep:1"
    V = np.random.default_rng(1).standard_normal((80, 16)).astype(np.float32)
    labels = np.where(V[:, 0] > 0, 1, -1)
    for _ in range(2):
        fit = vb.fit_steer("tilt", "a", labels, V, params={"method": "lm-steer", "rank": 2, "max_iter": 30})
        vb.wait(fit["id"], timeout=120)
    assert vb.set_steer_alias("tilt", "prod", 1)["aliases"] == ["prod"]
    assert vb.get_steer("tilt@prod")["version"] == 1
    moved = vb.transfer_steer("tilt@prod", "a2b", name="tilt-b")
    assert moved["space"] == "b" and vb.get_steer("tilt-b")["version"] == 1
    assert vb.delete_steer_version("tilt", 2)["deleted"]
    with pytest.raises(NotFoundError):
        vb.get_steer("tilt:2")


def test_a_plan_seed_is_sent_as_given_and_none_is_the_servers_default(vb, server):
    """plan() sent int(random_state): 1.7 planned with seed 1, "2" with 2, True with 1, and None was a TypeError;
    now as fit(): the service refuses what is not an integer (422) and None is its default seed, 0."""
    _, X, Y, _ = server
    for bad in (1.7, "2", True):
        with pytest.raises(ValidationError) as e:
            vb.plan(X[:300], X[:200], Y[:200], random_state=bad)
        assert e.value.status == 422 and "random_state" in e.value.message, bad
    default, zero = (vb.plan(X[:300], X[:200], Y[:200], random_state=s) for s in (None, 0))
    assert default == zero
    assert vb.plan(X[:300], X[:200], Y[:200], random_state=np.int64(3))["alignability"] > 0.4


@pytest.mark.parametrize("url", ["127.0.0.1:8781", "localhost:8781", "htp://127.0.0.1:1"])
def test_a_base_url_without_a_scheme_is_refused_at_once(url):
    """Client("127.0.0.1:8781") was retried three times (~1.5 s) and then "no answer from ..."."""
    from align.exceptions import InputError
    from service.client import AsyncClient, Client

    for cls in (Client, AsyncClient):
        with pytest.raises(InputError, match="base_url must start with http:// or https://"):
            cls(url)


@pytest.mark.parametrize("option, bad", [("timeout", math.inf), ("timeout", -1), ("timeout", 0), ("timeout", "5"),
                                         ("max_retries", -1), ("max_retries", 1.5), ("max_retry_wait", math.nan),
                                         ("max_retry_wait", -1), ("page_size", 0)])
def test_bad_client_times_and_counts_are_refused_at_once(option, bad):
    """Before, timeout=inf raised a bare OverflowError, timeout=-1 a ValueError, timeout=0 timed every request out
    as "no answer"; max_retries=-1, max_retry_wait=NaN and page_size=0 (sent to the service) were taken."""
    from align.exceptions import InputError
    from service.client import AsyncClient, Client

    for cls in (Client, AsyncClient):
        with pytest.raises(InputError, match=option):
            cls("http://127.0.0.1:9", **{option: bad})
    with Client("http://127.0.0.1:9", timeout=None, max_retry_wait=math.inf, max_retries=0):
        pass  # no limit, wait out any Retry-After, no retries: meant


@pytest.mark.parametrize("option, bad", [("poll", -1), ("poll", 0), ("poll", math.nan), ("timeout", math.nan),
                                         ("timeout", -1)])
def test_wait_refuses_a_poll_or_timeout_that_would_spin_or_never_end(option, bad):
    """Before, wait(poll=-1 | 0 | NaN) polled as fast as it could (busy-looping on the service) and
    wait(timeout=NaN) never timed out; nothing is sent now."""
    from align.exceptions import InputError
    from service.client import Client

    with Client("http://127.0.0.1:9", max_retries=0) as vb, pytest.raises(InputError, match=option):
        vb.wait("j1", **{option: bad})  # nothing listens there: refused before any request


def test_a_closed_client_says_so_in_a_typed_error():
    """After close(), a call raised httpx's bare RuntimeError ("Cannot send a request, as the client has been
    closed"), sync and async alike."""
    import asyncio

    from service.client import APIConnectionError, AsyncClient, Client

    c = Client("http://127.0.0.1:9")
    c.close()
    with pytest.raises(APIConnectionError, match="this client was closed"):
        c.list_spaces()

    async def main():
        a = AsyncClient("http://127.0.0.1:9")
        await a.close()
        with pytest.raises(APIConnectionError, match="this client was closed"):
            await a.list_spaces()

    asyncio.run(main())


def test_what_is_not_real_numbers_is_refused_before_a_byte_is_sent():
    """QA: strings (X.astype(str)), objects, datetime64 and timedelta64 arrays were cast and sent, though the
    docstring says what is not real numbers is refused here; booleans (a mask, X > 0) went as 0/1; a masked array
    sent its hidden values; a torch tensor that requires grad raised a bare RuntimeError. Each is an InputError now,
    raised before any connection (nothing listens on the port: a send would be a connection error)."""
    torch = pytest.importorskip("torch")
    X = np.random.default_rng(0).normal(size=(3, 16))
    bad = {"dtype <U": X.astype(str), "dtype object": X.astype(object),
           "datetime64": np.zeros((2, 16), "datetime64[s]"), "timedelta64": np.zeros((2, 16), "timedelta64[s]"),
           r"astype\(np.float32\)": X > 0, "masked entries": np.ma.masked_array(X, mask=X > 1),
           "requires grad": torch.tensor(X, requires_grad=True)}
    with Client("http://127.0.0.1:19379", api_key=RKEY) as vb:
        for message, Z in bad.items():
            with pytest.raises(InputError, match=message):
                matrix(Z)
            with pytest.raises(InputError, match=message):
                vb.transform("a2b", Z)
    for ok in (X.astype(np.float16), X.astype(np.int64), np.ma.masked_array(X), X.tolist()):
        assert matrix(ok).dtype == np.float32


def test_labels_relevant_rows_and_seed_pairs_that_are_not_integers_are_refused_before_sending():
    """The client cast with ``int()``: labels [0.5, -0.5] went as [0, 0] (a steer fitted from nothing), True as 1,
    a seed pair (0.9, 2) as (0, 2), where the service refuses anything but integers. They are refused here now,
    before a byte is sent (the server at port 1 is not there: a request would be an APIConnectionError)."""
    from service.client import APIConnectionError
    from service.client_wire import as_ints

    X = np.ones((4, 3), dtype=np.float32)
    with Client("http://127.0.0.1:1", max_retries=0) as vb:
        for send, what in [(lambda: vb.fit_steer("s", "a", [0.5, -0.5, 1, -1], X), "labels"),
                           (lambda: vb.fit_steer("s", "a", [True, False, 1, -1], X), "labels"),
                           (lambda: vb.fit_steer("s", "a", np.array([1.0, -1.5, 0.0, 1.0]), X), "labels"),
                           (lambda: vb.delete_ids("ix", [1.9, 2]), "ids"),
                           (lambda: vb.delete_ids("ix", [True]), "ids"),
                           (lambda: vb.lm_fit_steer("s", ["x", "y"], [1, np.bool_(True)]), "labels"),
                           (lambda: vb.plan(X, X, X, queries=X, old_queries=X, relevant=[0, 1.5, 2, 3]),
                            "relevant"),
                           (lambda: vb.fit("m", "a", "b", X, X, seed_pairs=[(0.9, 2)]), "seed_pairs"),
                           (lambda: vb.fit("m", "a", "b", X, X, seed_pairs=[(0, 1, 2)]), "seed_pairs")]:
            with pytest.raises(InputError, match=rf"^{what}\["):
                send()
        with pytest.raises(APIConnectionError):  # integers are sent (and fail here only for want of a server)
            vb.fit_steer("s", "a", np.array([1, -1, 0, 1], dtype=np.int8), X)
    assert as_ints(np.array([[1, 2], [3, 4]], dtype=np.uint16), "p", width=2) == [[1, 2], [3, 4]]
    assert as_ints(np.sign(np.array([0.3, -2.0, 0.0])), "labels") == [1, -1, 0]  # whole floats, as align takes them
    assert [type(v) for v in as_ints([np.int64(1), -1], "labels")] == [int, int] and as_ints(None, "x") is None


def test_plan_takes_k_as_plan_k_does(vb, server):
    """Client.plan had no k: the rows for a budget of the user's (``plan --k``, HTTP ``k``) were out of its reach."""
    _, X, Y, _ = server
    own = vb.plan(X[:300], X[:200], Y[:200])
    k = own["recommended"]["k"]
    assert vb.plan(X[:300], X[:200], Y[:200], k=k)["rows_to_embed"] == own["rows_to_embed"]
    assert len(vb.plan(X[:300], X[:200], Y[:200], k=7)["rows_to_embed"]) == 7
    with pytest.raises(ValidationError) as e:
        vb.plan(X[:300], X[:200], Y[:200], k=301)
    assert "k 301 is more rows than old holds (300)" in e.value.message


def test_plan_takes_keep_as_plan_keep_does(vb, server):
    """``keep`` (``plan --keep``, HTTP ``keep``): the recommendation reads the forecast with the rows kept, never a
    larger K."""
    _, X, Y, _ = server
    plain, kept = (vb.plan(X[:300], X[:200], Y[:200], target_retention=0.99, keep=keep) for keep in (False, True))
    assert (plain["recommended"]["forecast"], kept["recommended"]["forecast"]) == ("retention", "kept")
    assert kept["predicted"] == plain["predicted"] and kept["recommended"]["k"] <= plain["recommended"]["k"]
    # bool() sent "false" and "no" as keep: true (a review's find); a flag is a bool, refused before any request
    for bad in ("false", "no", 1, None):
        with pytest.raises(InputError, match="keep must be True or False"):
            vb.plan(X[:300], X[:200], Y[:200], keep=bad)
    with pytest.raises(InputError, match="csls must be True or False"):
        vb.evaluate("nope", X[:20], Y[:20], csls="false")


@both_clients
def test_embed_counts_or_refuses_the_texts_the_model_cuts(vb):
    """``POST /v1/embeddings`` counts the texts MiniLM cut at 256 word pieces (``usage.truncated``) and refuses them
    with ``truncate: false``; the client passes ``truncate`` and sums each batch's ``usage`` (``with_usage``)."""
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~360 word pieces
    E, usage = vb.embed(["a cat", long], "all-MiniLM-L6-v2", with_usage=True)
    # MiniLM's tokens read: [CLS] a cat [SEP], and the long text's first 256
    assert E.shape == (2, 384) and usage["truncated"] == 1 and usage["total_tokens"] == 4 + 256, usage
    E2, versions, usage2 = vb.embed(["a cat"], "all-MiniLM-L6-v2", truncate=False, with_versions=True,
                                    with_usage=True)
    assert versions == [] and usage2["truncated"] == 0 and np.allclose(E2, E[:1], atol=1e-6)
    with pytest.raises(ValidationError, match=r"input\[1\] is \d+ tokens long, more than the 256"):
        vb.embed(["a cat", long], "all-MiniLM-L6-v2", truncate=False)
    with pytest.raises(InputError, match="truncate must be True or False"):
        vb.embed(["a cat"], "all-MiniLM-L6-v2", truncate="no")


@both_clients
def test_embed_in_batches_names_the_callers_row_of_a_text_too_long(server, client_cls):
    """Sent in batches, a text refused for its length (``truncate=False``) was named by its row in the batch in
    ``details[0]["loc"]`` (the message's note mapped it, the details did not): both name the caller's row now."""
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~360 word pieces
    with client_cls(server[0], api_key=WKEY, batch_size=2) as vb:
        with pytest.raises(ValidationError) as e:
            vb.embed(["a cat", "a dog", "a bird", long], "all-MiniLM-L6-v2", truncate=False)
    detail = e.value.details[0]
    assert detail["loc"] == ["body", "input", 3] and detail["ctx"]["batch_rows"] == [2, 3], detail
    assert "row 1 of the batch is row 3 of the input" in e.value.message, e.value.message
