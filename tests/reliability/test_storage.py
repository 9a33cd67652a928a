"""A read-only, immutable or full data dir (issue 15, finding 4).

Before: with the data dir made immutable, the next ``POST /v1/fits`` killed the server with
SIGBUS (SQLite's WAL maps its ``-shm`` file; a mapped page the disk cannot back is a SIGBUS),
earlier writes were opaque 500s, and ``/readyz`` said ready; on a full disk, 500s and ready.
Now: the process stays up, writes answer 503 ``StorageUnavailableError``, reads keep working,
``/readyz`` is 503 with ``checks.data_dir`` saying why, and everything recovers once the disk does.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest
from _servers import file_size_limit

from service.storage import data_dir_status, is_storage_error

from .helpers import R, W, Server, fit_body, wait_job


def test_status_and_classification(tmp_path):
    assert data_dir_status(tmp_path) == "ok"
    assert data_dir_status(tmp_path, min_free_bytes=2**62).startswith("nearly full")
    assert not list(tmp_path.iterdir()), "the probe left a file behind"
    assert is_storage_error(OSError(errno.ENOSPC, "No space left on device"))
    assert is_storage_error(sqlite3.OperationalError("attempt to write a readonly database"))
    assert not is_storage_error(OSError(errno.ENOENT, "gone")) and not is_storage_error(ValueError("x"))


def test_a_refused_write_says_why_by_errno_and_readyz_probes_the_subfolders(tmp_path):
    """A subfolder given to another user (``chown root DATA/artifacts``, the service as uid 65534): a fit failed
    "the data directory cannot be written (read-only, immutable or full disk) ... (PermissionError ...)" while
    /readyz said ready. Now the words follow the errno and name the path, and data_dir_status checks artifacts/,
    reports/ and indexes/ (and names a jobs.sqlite that is a folder)."""
    from service.storage import storage_message

    where = str(tmp_path / "artifacts" / "cd")
    msg = storage_message(PermissionError(errno.EACCES, "Permission denied", where))
    assert f"permission denied on {where} (running as uid {os.getuid()}): give the folder to that user" in msg
    msg = storage_message(OSError(errno.EROFS, "Read-only file system", where))
    assert f"read-only file system holding {where}" in msg and "chown" not in msg
    assert f"no space left on the device holding {where}" in storage_message(OSError(errno.ENOSPC, "full", where))
    (tmp_path / "jobs.sqlite").mkdir()
    assert data_dir_status(tmp_path) == f"not writable: {tmp_path / 'jobs.sqlite'} is a folder, not a SQLite " \
                                        "database file: move it aside"
    (tmp_path / "jobs.sqlite").rmdir()
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="vb-uid-"))  # pytest's tmp_path is root's alone (0700 above it)
    try:
        (d / "artifacts").mkdir()
        os.chown(d, 65534, 65534)  # the data dir is the service user's; artifacts/ stays root's
        show = "import sys; from service.storage import data_dir_status; print(data_dir_status(sys.argv[1]))"
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                            show, str(d)], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],
                           check=False)
        assert r.stdout.strip() == (f"not writable: permission denied on {d / 'artifacts'} (running as uid 65534): "
                                    "give the folder to that user (chown), or clear its immutable flag (chattr -i)"
                                    ), r.stdout + r.stderr
    finally:
        shutil.rmtree(d)


def _freeze(d: Path) -> bool:
    """Make ``d`` unwritable for this user: ``chmod`` for a normal user, ``chattr +i`` for root. False: cannot."""
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(d)], check=True)
        return True
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "-R", "+i", str(d)], capture_output=True).returncode == 0


def _thaw(d: Path) -> None:
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "u+w", str(d)], check=True)
    else:
        subprocess.run(["chattr", "-R", "-i", str(d)], capture_output=True)


def _exercise_writes(c: httpx.Client, tag: str) -> list[tuple[str, int, str]]:
    out = []
    for what, call in (("fit", lambda: c.post("/v1/fits", json=fit_body(f"a2b{tag}"))),
                       ("index-add", lambda: c.post("/v1/indexes/ix/vectors", json={"vectors": [[0.3] * 16] * 4})),
                       ("alias", lambda: c.put("/v1/maps/a2b/aliases/x", json={"version": 1})),
                       ("space", lambda: c.post("/v1/spaces", json={"name": f"s{tag}", "dim": 4}))):
        r = call()
        out.append((what, r.status_code, r.json()["error"]["type"] if r.status_code >= 400 else ""))
    return out


def _world(s: Server) -> httpx.Client:
    c = s.client(W)
    r = c.post("/v1/fits", json=fit_body("a2b"))
    assert r.status_code == 202, r.text
    assert wait_job(c, r.json()["id"])["state"] == "succeeded"
    r = c.post("/v1/indexes", json={"name": "ix", "space": "b", "vectors": np.eye(16, dtype=np.float32).tolist()})
    assert r.status_code == 201, r.text
    return c


def test_immutable_data_dir_no_crash_503_and_not_ready(tmp_path):
    d = tmp_path / "data"
    with Server(d) as s:
        c = _world(s)
        if not _freeze(d):
            pytest.skip("cannot make the data dir unwritable here (chattr +i refused)")
        try:
            ready = httpx.get(s.url + "/readyz", timeout=30)
            assert ready.status_code == 503 and ready.json()["checks"]["data_dir"].startswith("not writable"), ready.text
            results = [r for i in range(2) for r in _exercise_writes(c, str(i))]
            assert s.proc.poll() is None, f"server died (exit {s.proc.returncode}): {s.log()[-1500:]}"
            assert all(code == 503 and kind == "StorageUnavailableError" for _, code, kind in results), results
            # reads still answer
            assert s.client(R).get("/v1/maps").status_code == 200
            assert s.client(R).post("/v1/indexes/ix/search", json={"vectors": [[1.0] + [0.0] * 15], "k": 1}
                                    ).status_code == 200
        finally:
            _thaw(d)
        assert httpx.get(s.url + "/readyz", timeout=30).status_code == 200
        assert [code for _, code, _ in _exercise_writes(c, "after")] == [202, 200, 200, 201]
        assert s.proc.poll() is None


@pytest.mark.parametrize("db", ["registry.sqlite", "jobs.sqlite"])
def test_a_database_file_replaced_under_the_service_is_named_not_a_read_only_disk(tmp_path, db):
    """A backup restored by moving it back over registry.sqlite (or ``rm jobs.sqlite``) under a running service:
    its connections keep the unlinked file, so every write failed 503 "the data directory cannot be written
    (read-only, immutable or full disk)" (SQLITE_READONLY_DBMOVED reads "readonly database") and /readyz said ready.
    Now /readyz is 503 naming the file and saying to restart, and the writes say the same."""
    d = tmp_path / "data"
    with Server(d) as s:
        c = _world(s)
        shutil.copy2(d / db, tmp_path / "backup.sqlite")
        os.replace(tmp_path / "backup.sqlite", d / db)
        ready = httpx.get(s.url + "/readyz", timeout=30)
        assert ready.status_code == 503, ready.text
        assert ready.json()["checks"]["data_dir"] == (f"{db}: database file replaced or removed since the service "
                                                      "opened it: restart the service"), ready.text
        r = (c.post("/v1/spaces", json={"name": "s9", "dim": 4}) if db == "registry.sqlite"
             else c.post("/v1/fits", json=fit_body("a2b9")))
        msg = r.json()["error"]["message"]
        assert r.status_code == 503 and f"{db}: database file replaced or removed" in msg, r.text
        assert "read-only" not in msg and "restart the service" in msg
        assert s.proc.poll() is None


def test_a_data_dir_made_again_for_a_new_app_in_the_process_is_not_replaced(tmp_path):
    """The files opened were kept per process by path, first open only: an app shut down, its data dir removed and
    made again, and a new app on the same path in the same process (tests, notebooks) was "database file replaced"
    for good on /readyz, its writes 503 naming every stale path; a data dir reached through a link was never named.
    Each registry and job store now keeps what it opened, and /readyz asks this app's own."""
    from fastapi.testclient import TestClient

    from service.api import create_app
    from tests._api_support import W as WRITE
    from tests._api_support import settings_for

    real = tmp_path / "real"
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    for round in range(2):
        real.mkdir()
        with TestClient(create_app(settings_for(tmp_path / "link", data_dir=tmp_path / "link"))) as c:
            assert c.post("/v1/spaces", json={"name": "s1", "dim": 4}, headers=WRITE).status_code == 201
            ready = c.get("/readyz")
            assert ready.status_code == 200 and ready.json()["checks"]["data_dir"] == "ok", (round, ready.text)
            if round:  # replaced through the link: named, as the file the service opened
                for db in ("registry.sqlite", "jobs.sqlite"):
                    shutil.copy2(real / db, real / "x.sqlite")
                    os.replace(real / "x.sqlite", real / db)
                assert c.get("/readyz").json()["checks"]["data_dir"] == "; ".join(
                    f"{db}: database file replaced or removed since the service opened it: restart the service"
                    for db in ("registry.sqlite", "jobs.sqlite"))
                r = c.post("/v1/spaces", json={"name": "s2", "dim": 4}, headers=WRITE)
                assert r.status_code == 503 and r.json()["error"]["message"].startswith(
                    "registry.sqlite: database file replaced"), r.text
        shutil.rmtree(real)


def test_a_read_only_artifact_folder_is_named_by_its_errno_wherever_it_is(tmp_path):
    """/readyz probed artifacts/ with access(2) alone and called a read-only bind mount (EROFS) "permission denied
    ... give the folder to that user (chown)"; serve's refusal then gave the chown advice twice; and an artifact dir
    set apart from the data dir (compose's VECBRIDGE_ARTIFACT_DIR=/artifacts) was never probed."""
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.api.app import _check_data_dir
    from service.errors import NotConfiguredError
    from tests._api_support import settings_for

    ext, data = tmp_path / "artifacts", tmp_path / "data"
    (ext / "tmp").mkdir(parents=True)
    data.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(ext), str(ext)], capture_output=True,
                                                 check=False).returncode:
        pytest.skip("needs root and mount to make a read-only bind mount")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ext)], capture_output=True, check=False).returncode:
            pytest.skip("cannot remount a bind mount read-only here")
        said = f"not writable: read-only file system holding {ext}: remount it read-write"
        assert data_dir_status(tmp_path) == said  # artifacts/ of a data dir: by its errno, not "(chown)"
        assert data_dir_status(data, folders=[ext]) == said and data_dir_status(data) == "ok"  # set apart
        settings = settings_for(tmp_path, data_dir=data, artifact_dir=ext)
        with TestClient(create_app(settings)) as c:
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["data_dir"] == said, ready.text
        with pytest.raises(NotConfiguredError) as refused:
            _check_data_dir(settings)
        assert said in str(refused.value) and "chown" not in str(refused.value), str(refused.value)
    finally:
        subprocess.run(["umount", "-l", str(ext)], capture_output=True, check=False)


def _mount_tmpfs(d: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    d.mkdir(parents=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                          capture_output=True).returncode == 0


def _fill(mnt: Path) -> None:
    """Fill the file system of ``mnt`` to the last byte (a file ``fill-*`` in it)."""
    with open(mnt / f"fill-{uuid.uuid4().hex}", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(bytes(1 << 16))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:
                fh.write(b"x")
        except OSError:
            pass


@contextlib.contextmanager
def _full_disk(mnt: Path, setup=lambda mnt: None) -> Iterator[Path]:
    """``mnt``: a 2 MiB tmpfs, ``setup(mnt)`` run on it, then filled to the last byte for the ``with`` body (new
    empty files still fit)."""
    if not _mount_tmpfs(mnt, "2m"):
        pytest.skip("needs root and mount to make a small filesystem")
    try:
        setup(mnt)
        _fill(mnt)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def _fit_cli(tmp_path: Path) -> list:
    """``vecbridge --data-dir tmp_path/data fit ... --name m`` of two small paired files."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 8))
    np.save(tmp_path / "x.npy", X.astype(np.float32))
    np.save(tmp_path / "y.npy", (X @ np.linalg.qr(rng.normal(size=(8, 8)))[0]).astype(np.float32))
    return ["--data-dir", tmp_path / "data", "fit", "--source", tmp_path / "x.npy", "--target", tmp_path / "y.npy",
            "--method", "procrustes", "--name", "m", "--quiet"]


def _versions(capsys, tmp_path: Path) -> list[int]:
    from conftest import run_cli

    out = json.loads(run_cli(capsys, "--data-dir", tmp_path / "data", "registry", "list", "--json")[1])
    return [m["n_versions"] for m in out["maps"]]


def test_a_fit_report_copy_the_disk_cannot_take_warns_and_keeps_the_version(tmp_path, capsys):
    """``fit --report FILE`` on a full disk: exit 2 with ``[Errno 28] No space left on device`` although the version
    was registered (and an alias moved), so a retrying script registered it again. Now a warning naming the file and
    the version, exit 0, as for the data dir's own report."""
    from conftest import run_cli

    fit = _fit_cli(tmp_path)
    with _full_disk(tmp_path / "mnt") as mnt:
        rc, out, err = run_cli(capsys, *fit, "--report", mnt / "r.html")
        assert not (mnt / "r.html").exists()
    assert rc == 0, err
    assert (f"vecbridge: warning: the report copy {mnt / 'r.html'} could not be written (No space left on device); "
            f"map m:1 is registered all the same") in err.splitlines(), err
    assert out.startswith("registered m:1 ") and _versions(capsys, tmp_path) == [1]


def test_a_fit_whose_report_the_data_dir_cannot_take_prints_no_report_path(tmp_path, capsys):
    """A fit whose data-dir report could not be written (a full disk; here a file where the reports folder goes)
    printed ``report: /.../reports/m/....html``, a file that is not there. Now it says the report was not written."""
    from conftest import run_cli

    fit = _fit_cli(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "reports").touch()
    rc, out, err = run_cli(capsys, *fit)
    assert rc == 0, err
    last = out.splitlines()[-1]
    assert last.startswith(f"report: none ({tmp_path / 'data' / 'reports' / 'm'}/") and last.endswith(
        ".html could not be written)"), out


def test_a_full_disk_names_where_and_what_to_do(tmp_path, capsys):
    """A fit's artifact, a transform's output (.npy, .fvecs, .parquet), an export, an index on a full disk: each
    printed ``vecbridge: error: [Errno 28] No space left on device`` (parquet: pyarrow's words), naming no file.
    Now one message: the file or folder being written, and what to do."""
    from conftest import run_cli

    fit = _fit_cli(tmp_path)
    assert run_cli(capsys, *fit)[0] == 0
    good = ["--data-dir", tmp_path / "data"]
    x = tmp_path / "x.npy"

    def setup(mnt):  # a registry on the disk that fills
        assert run_cli(capsys, "--data-dir", mnt / "data", *fit[2:])[0] == 0

    with _full_disk(tmp_path / "mnt", setup) as mnt:
        cases = {mnt / "data" / "artifacts": ["--data-dir", mnt / "data", "fit", "--source", tmp_path / "y.npy",
                                              "--target", x, "--method", "procrustes", "--name", "m2", "--quiet"],
                 mnt / "data" / "indexes": ["--data-dir", mnt / "data", "index", "create", "ix", "--space", "y",
                                            x, "--quiet"],
                 mnt / "e.zip": [*good, "registry", "export", mnt / "e.zip"],
                 mnt / "edir": [*good, "registry", "export", mnt / "edir"],
                 **{mnt / f"o.{s}": [*good, "transform", "--map", "m", x, mnt / f"o.{s}", "--quiet"]
                    for s in ("npy", "fvecs", "parquet")}}
        for where, args in cases.items():
            rc, _, err = run_cli(capsys, *args)
            assert rc == 2 and len(err.splitlines()) == 1, (args, err)
            assert err.startswith(f"vecbridge: error: no space left on the device holding {where}"), err
            assert err.endswith(": free some space there (or write elsewhere) and run the command again\n"), err
        assert sorted(p.name for p in mnt.iterdir() if not p.name.startswith("fill-")) == ["data"]


def test_a_backup_to_a_full_disk_names_dest_not_the_data_dir(tmp_path, capsys):
    """``vecbridge backup DEST`` onto a full disk said "the data directory cannot be written (read-only, immutable
    or full disk); nothing was changed (OperationalError: database or disk is full)": the data dir was fine, DEST's
    disk was full. Now the message names DEST; no DEST (nor its temporary folder) is left."""
    from conftest import run_cli

    assert run_cli(capsys, *_fit_cli(tmp_path))[0] == 0
    with _full_disk(tmp_path / "mnt") as mnt:
        rc, _, err = run_cli(capsys, "--data-dir", tmp_path / "data", "backup", mnt / "bk", "--quiet")
        left = sorted(p.name for p in mnt.iterdir() if not p.name.startswith("fill-"))
    assert rc == 2 and err == (f"vecbridge: error: no space left on the device holding {mnt / 'bk'}: free some "
                               f"space there (or write elsewhere) and run the command again\n"), err
    assert left == []


def test_full_disk_no_crash_503_and_not_ready(tmp_path):
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, "24m"):
        pytest.skip("needs root and mount to make a small filesystem")
    try:
        with Server(mnt / "data", env={"VECBRIDGE_MIN_FREE_BYTES": str(4 * 2**20)}) as s:
            c = _world(s)
            _fill(mnt)
            ready = httpx.get(s.url + "/readyz", timeout=30)
            assert ready.status_code == 503 and ready.json()["checks"]["data_dir"] != "ok", ready.text
            results = [r for i in range(2) for r in _exercise_writes(c, str(i))]
            assert s.proc.poll() is None, f"server died (exit {s.proc.returncode}): {s.log()[-1500:]}"
            assert all(code == 503 for _, code, _ in results), results
            assert s.client(R).get("/v1/maps").status_code == 200
            for f in mnt.glob("fill-*"):
                f.unlink()
            assert httpx.get(s.url + "/readyz", timeout=30).status_code == 200
            assert [code for _, code, _ in _exercise_writes(c, "after")] == [202, 200, 200, 201]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def test_index_file_cut_short_is_503_and_never_committed(tmp_path):
    """A FAISS file that cannot be written whole (full disk, file-size limit) must fail the add, never be committed.

    Before: FAISS's own file writer only printed when the final flush failed, so an add whose index file
    went a few bytes past the limit answered 200 with a truncated file committed; after a restart the index
    (every row) could not be loaded. A write failing earlier was a bare RuntimeError: 500.
    Now both are 503 StorageUnavailableError, the index keeps its rows, and it loads after a restart.
    """
    dim, n = 64, 1000
    X = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    whole = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    whole.add_with_ids(X, np.arange(n, dtype=np.int64))
    limit = faiss.serialize_index(whole).size - 10  # n rows overrun only in the last buffered bytes
    d = tmp_path / "data"
    s = Server(d)
    with file_size_limit(limit):
        s.start()
    try:
        c = s.client(W)
        assert c.post("/v1/spaces", json={"name": "s64", "dim": dim}).status_code == 201
        r = c.post("/v1/indexes", json={"name": "ix", "space": "s64", "kind": "flat", "vectors": X[:n - 1].tolist()})
        assert r.status_code == 201, r.text
        # a small add is logged (its rows only): ask for snapshots, as a reader that met a damaged file does, so
        # that these adds write the whole FAISS file
        (d / "indexes" / "ix" / "snapshot-wanted").touch()
        for rows in (X[n - 1:], X[:300] + 1.0):  # past the limit at the final flush; in the middle of the write
            r = c.post("/v1/indexes/ix/vectors", json={"vectors": rows.tolist()})
            assert r.status_code == 503 and r.json()["error"]["type"] == "StorageUnavailableError", r.text
            assert s.proc.poll() is None
            assert c.get("/v1/indexes/ix").json()["count"] == n - 1
        hit = c.post("/v1/indexes/ix/search", json={"vectors": X[:1].tolist(), "k": 1}).json()["results"][0][0]
        assert hit["id"] == 0
    finally:
        s.stop()
    assert not list((d / "indexes" / "ix").glob(".*.tmp-*")), "a temporary file was left behind"
    with Server(d) as s2:
        r = s2.client(R).get("/v1/indexes/ix")
        assert r.status_code == 200 and r.json()["count"] == n - 1, r.text


@pytest.mark.parametrize("mode", [0o600, 0o666])
def test_a_lock_file_is_never_there_unlocked(tmp_path, monkeypatch, mode):
    """``hold(create=True)`` made the file, then locked it: a sweep in another process in between took it for a dead
    writer's and removed what it marked (CI, session 32: two workers creating one index, a 500 FileNotFoundError).
    Here a sweep runs at the instant ``hold`` locks: it must find nothing to take."""
    import fcntl

    from service import storage

    path, seen = tmp_path / "marker", []
    real = fcntl.flock

    def sweep_then_lock(fd, op):
        if op == fcntl.LOCK_EX and not seen:  # hold's lock, not the sweep's own (LOCK_EX | LOCK_NB)
            taken = storage.take_abandoned(path)
            seen.append(taken)
            if taken is not None:  # the sweep would remove it now; let go, so hold goes on and the test fails
                os.close(taken)
        return real(fd, op)

    monkeypatch.setattr(storage.fcntl, "flock", sweep_then_lock)
    fd = storage.hold(path, create=True, mode=mode)
    monkeypatch.undo()
    try:
        assert seen == [None] and path.is_file()  # nothing to take then; now there, locked
        assert storage.take_abandoned(path) is None
        assert os.stat(path).st_mode & 0o777 == mode & ~_umask()
        assert [p.name for p in tmp_path.iterdir()] == ["marker"]  # no private name left behind
        with pytest.raises(FileExistsError):
            storage.hold(path, create=True)
    finally:
        os.close(fd)
    taken = storage.take_abandoned(path)  # its holder gone: free
    assert taken is not None
    os.close(taken)


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_a_transform_into_an_unwritable_folder_names_the_output_not_a_temporary(tmp_path, capsys):
    """``transform --map m x.npy rodir/o.npy`` said ``[Errno 13] Permission denied: 'rodir/..o.npy.part-<pid>-<id>
    ...'``, naming the writer's hidden temporary file. Now the output the user gave, before any row is read, as
    ``fit --report`` has it (check_writable)."""
    from conftest import run_cli

    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", X @ np.linalg.qr(rng.normal(size=(8, 8)))[0].astype(np.float32))
    d = ["--data-dir", str(tmp_path / "data")]
    assert run_cli(capsys, *d, "fit", "--source", tmp_path / "x.npy", "--target", tmp_path / "y.npy", "--method",
                   "procrustes", "--name", "m", "--quiet")[0] == 0
    (tmp_path / "rodir").mkdir()
    if not _freeze(tmp_path / "rodir"):
        pytest.skip("cannot make a folder unwritable here (chattr +i refused)")
    try:
        rc, _, err = run_cli(capsys, *d, "transform", "--map", "m", tmp_path / "x.npy", tmp_path / "rodir/o.npy",
                             "--quiet")
    finally:
        _thaw(tmp_path / "rodir")
    assert rc == 2 and len(err.splitlines()) == 1, (rc, err)
    assert err.startswith(f"vecbridge: error: the output {tmp_path / 'rodir/o.npy'}: cannot be written ("), err
    assert ".part-" not in err and list((tmp_path / "rodir").iterdir()) == []


def test_cli_writes_on_an_immutable_data_dir_are_one_line_exit_2(tmp_path, capsys):
    """`registry alias` and `fit` on an immutable data dir printed "internal error: OperationalError: attempt to
    write a readonly database", exit 3 (a bug's code); the registry was fine. Now one line naming the cause, exit 2,
    and nothing changed."""
    from conftest import run_cli

    d = tmp_path / "data"
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 8))
    np.save(tmp_path / "x.npy", X.astype(np.float32))
    np.save(tmp_path / "y.npy", (X @ np.linalg.qr(rng.normal(size=(8, 8)))[0]).astype(np.float32))
    fit = ["--data-dir", str(d), "fit", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy"),
           "--method", "procrustes", "--name", "m", "--quiet"]
    assert run_cli(capsys, *fit)[0] == 0
    if not _freeze(d):
        pytest.skip("cannot make the data dir unwritable here (chattr +i refused)")
    try:
        for args in (["--data-dir", str(d), "registry", "alias", "m", "prod", "1"], fit):
            rc, out, err = run_cli(capsys, *args)
            assert rc == 2 and len(err.splitlines()) == 1, (args, rc, err)
            assert err.startswith("vecbridge: error: the data directory cannot be written"), err
        rc, out, err = run_cli(capsys, "--data-dir", str(d), "registry", "list")
        assert rc == 0 and "latest 1  versions 1/1" in out and "aliases" not in out, out
    finally:
        _thaw(d)


def _deep(base: Path, length: int, name: str) -> Path:
    """A folder under ``base`` whose ``name`` inside is ``length`` bytes long once absolute."""
    pad = length - len(os.fsencode(base.resolve())) - len(name) - 2  # the two separators
    parts = [pad // 3, pad // 3, pad - 2 * (pad // 3) - 2]  # each under NAME_MAX
    return base.resolve().joinpath(*("d" * n for n in parts))


def test_a_database_path_too_long_for_sqlite_is_one_line_saying_so(tmp_path, capsys):
    """SQLite opens database paths of up to 512 bytes (its journal's name 8 longer): a longer data dir was "the
    data directory cannot be written (read-only, immutable or full disk)", and `serve` died in its start-up with a
    traceback (exit 3). Now both say the path is too long, one line, exit 2; a path of 504 bytes still works."""
    import sys

    from _servers import ROOT, free_port
    from conftest import run_cli

    from service.storage import MAX_SQLITE_PATH

    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", X[:, ::-1])
    fit = ["fit", "--source", tmp_path / "x.npy", "--target", tmp_path / "y.npy", "--method", "procrustes",
           "--name", "m", "--quiet"]
    fits = _deep(tmp_path / "a", MAX_SQLITE_PATH, "registry.sqlite")
    assert len(os.fsencode(fits / "registry.sqlite")) == MAX_SQLITE_PATH
    rc, out, err = run_cli(capsys, "--data-dir", fits, *fit)
    assert rc == 0 and (fits / "registry.sqlite").is_file(), err
    too_long = _deep(tmp_path / "b", MAX_SQLITE_PATH + 1, "registry.sqlite")
    rc, out, err = run_cli(capsys, "--data-dir", too_long, *fit)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("vecbridge: error: the database path /") and "SQLite opens paths of at most 504" in err, err
    p = subprocess.run([sys.executable, "-m", "service.cli", "--data-dir", str(too_long), "serve", "--port",
                        str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and "SQLite opens paths of at most" in p.stderr, \
        p.stderr[-3000:]


def test_a_sweep_stopped_part_way_leaves_the_rest_marked_for_the_next(tmp_path, monkeypatch):
    """A backup killed while it removed a dead backup's folder: rmtree had taken the IN_PROGRESS marker early, so
    the partial copy left behind was no longer marked and every later sweep kept it (6.6 MB stayed). The marker
    goes last now: stopped after any entry, the folder is still marked and the next sweep removes it."""
    from service import storage

    dead = tmp_path / ".b.tmp-0123abcd"
    real_unlink = os.unlink
    for kill_at in range(1, 12):  # 10 files and the marker: stopped at each unlink in turn
        (dead / "artifacts").mkdir(parents=True)
        for i in range(5):
            (dead / "artifacts" / f"a{i}").write_bytes(b"x")
            (dead / f"f{i}").write_bytes(b"y")
        (dead / storage.IN_PROGRESS).touch()
        calls = []

        def dies(path, *a, _at=kill_at, **kw):  # a kill -9 part-way through (rmtree unlinks through it too)
            calls.append(path)
            if len(calls) == _at:
                raise KeyboardInterrupt
            return real_unlink(path, *a, **kw)

        monkeypatch.setattr(os, "unlink", dies)
        with pytest.raises(KeyboardInterrupt):
            storage.sweep_abandoned(tmp_path)
        monkeypatch.setattr(os, "unlink", real_unlink)
        assert (dead / storage.IN_PROGRESS).exists(), f"unmarked after {kill_at} unlinks: kept forever"
        assert storage.sweep_abandoned(tmp_path) == [dead.name] and not dead.exists()
