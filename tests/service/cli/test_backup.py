"""``vecbridge backup DEST``: a consistent copy of a data dir taken while another process keeps writing to it,
restored by starting vecbridge on the copy. Real processes throughout: a writer process adding index rows
(increasing ids, small logged deltas, a snapshot and garbage collection of old generations every few dozen
adds) and registering map versions in a loop, a real ``vecbridge serve`` on the data dir, the backups run as
``python -m service.cli`` processes, and a real server started on a backup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from _servers import ROOT, damage_page, env_for, free_port, seed_registry, start, start_on_free_port, stop, wait_ready

from service.indexes import IndexStore
from service.registry import open_registry

RKEY = {"Authorization": "Bearer rkey-123"}
BATCH = 16  # rows per add of the writer: ids k*BATCH .. (k+1)*BATCH - 1


def row_of(ids) -> np.ndarray:
    """The 16-d row the writer stores under each id (a function of the id alone)."""
    return np.stack([np.random.default_rng(int(i)).standard_normal(16) for i in ids]).astype(np.float32)


WRITER = f"""
import sys, time
from pathlib import Path
import numpy as np
sys.path[:0] = [{str(Path(__file__).resolve().parent)!r}, {str(Path(__file__).resolve().parents[2])!r}]
from test_backup import BATCH, row_of
from align import fit_procrustes
from service.indexes import IndexStore
from service.registry import open_registry

data, log = Path(sys.argv[1]), Path(sys.argv[2])
idx = IndexStore(data / "indexes").get("docs")
reg = open_registry(f"sqlite:///{{data / 'registry.sqlite'}}", data / "artifacts")
rng = np.random.default_rng(1)
X = rng.standard_normal((64, 16)).astype(np.float32)
k = idx.count // BATCH
while not (data.parent / "stop").exists():
    ids = np.arange(k * BATCH, (k + 1) * BATCH)
    idx.add(row_of(ids), ids=ids, payloads=[{{"i": int(i)}} for i in ids])
    k += 1
    line = f"rows {{k * BATCH}}"
    if k % 8 == 0:  # another version of a2b (other bytes each time), prod moved to it
        Q, _ = np.linalg.qr(rng.standard_normal((16, 16)))
        v = reg.register_version("a2b", fit_procrustes(X, X @ Q.astype(np.float32)), source_space="a",
                                 target_space="b", method="procrustes", params={{}}, alias="prod")
        line += f" version {{v.version}}"
    with open(log, "a") as fh:
        fh.write(line + "\\n")
"""


def committed(log: Path) -> tuple[int, int]:
    """(rows, latest version) the writer had acknowledged when ``log`` was read."""
    rows, version = 0, 1
    text = log.read_text() if log.exists() else ""
    # a line is the writer's once its newline is there: a read can land inside its append (a write crossing a page
    # boundary is copied a page at a time), and "rows 15" of "rows 1584" would be read as 15 rows
    for line in text[: text.rfind("\n") + 1].splitlines():
        parts = line.split()
        rows = int(parts[1])
        if len(parts) == 4:
            version = int(parts[3])
    return rows, version


def cli(*args) -> subprocess.CompletedProcess:
    """``vecbridge ARGS`` as its own process."""
    return subprocess.run([sys.executable, "-m", "service.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture
def source(tmp_path):
    """A data dir with spaces a, b, the map a2b and the index docs (space b, 512 rows, ids 0..511)."""
    data = tmp_path / "var"
    seed_registry(data)
    ids = np.arange(512)
    IndexStore(data / "indexes").create("docs", "b", row_of(ids), ids=ids, payloads=[{"i": int(i)} for i in ids])
    return data


def check_restorable(dest: Path, at_least: tuple[int, int], at_most: tuple[int, int]) -> int:
    """The backup ``dest`` as a data dir: registry verify clean, versions 1..V of a2b each loading and V in the
    writer's range, prod on one of them; docs at a committed generation: ids exactly 0..n-1 (a prefix of what
    the writer added, whole batches), n in the writer's range, every row and payload the one written."""
    assert json.loads((dest / "backup.json").read_text())["format"] == "vecbridge.backup"
    r = cli("--data-dir", dest, "registry", "verify")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stdout + r.stderr
    reg = open_registry(f"sqlite:///{dest / 'registry.sqlite'}", dest / "artifacts")
    try:
        versions = [v.version for v in reg.list_versions("a2b")]
        assert versions == list(range(1, len(versions) + 1))
        assert at_least[1] <= len(versions) <= at_most[1]
        for v in versions:
            assert reg.load_map(f"a2b:{v}").source_dim == 16
        assert reg.resolve("a2b@prod").version in versions
    finally:
        reg.close()
    idx = IndexStore(dest / "indexes").get("docs")
    n = idx.count
    assert idx.has_ids(np.arange(n)).all(), "ids are not exactly 0..n-1"
    assert n % BATCH == 0 and at_least[0] <= n <= at_most[0], (n, at_least, at_most)
    probe = np.array([0, n // 2, n - 1])
    scores, hits = idx.search(row_of(probe), k=1)
    assert hits[:, 0].tolist() == probe.tolist() and np.allclose(scores[:, 0], 1, atol=1e-5)
    assert idx.get_payloads(probe) == [{"i": int(i)} for i in probe]
    return n


def test_backup_taken_while_a_process_writes_restores_at_a_committed_state(source, tmp_path):
    data = source
    log = tmp_path / "writer.log"
    server, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"],
                                                    env_for(data, port)), tmp_path / "srv.log")
    with open(tmp_path / "writer.err", "wb") as err:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(data), str(log)], cwd=ROOT, stderr=err)
    backups = []
    try:
        deadline = time.monotonic() + 60
        while committed(log)[1] < 3:  # the writer has made snapshots, collected generations, added versions
            assert writer.poll() is None and time.monotonic() < deadline, (tmp_path / "writer.err").read_text()
            time.sleep(0.1)
        for i, extra in enumerate([["--link"], [], ["--link"]]):
            before = committed(log)
            dest = tmp_path / f"backup{i}"
            r = cli("--data-dir", data, "backup", dest, "--quiet", *extra)
            assert r.returncode == 0, r.stderr
            rows, version = committed(log)
            # the writer logs an iteration after its add (and version) commit: one iteration may be in the
            # backup but not yet in the log read after it, so the upper bound is one batch and one version more
            backups.append((dest, before, (rows + BATCH, version + 1)))
            assert f"written to {dest}" in r.stdout and "restore: vecbridge --data-dir" in r.stdout
        assert writer.poll() is None, (tmp_path / "writer.err").read_text()
    finally:
        (tmp_path / "stop").touch()
        writer.wait(60)
        stop(server)
    assert writer.returncode == 0, (tmp_path / "writer.err").read_text()

    sizes = [check_restorable(dest, lo, hi) for dest, lo, hi in backups]
    assert sizes[-1] > sizes[0]  # the writer moved on between the backups; each holds its own state
    # --link: never-changed files shared with the data dir (hard links, kept by the backup after the writer
    # collected them from the data dir), SQLite files always copies; default (--copy): nothing shared
    manifests = [json.loads((dest / "backup.json").read_text()) for dest, _, _ in backups]
    assert manifests[0]["linked"] > 0 and manifests[1]["linked"] == 0
    assert (backups[0][0] / "registry.sqlite").stat().st_ino != (data / "registry.sqlite").stat().st_ino
    assert all(f.stat().st_nlink == 1 for f in (backups[1][0]).rglob("*") if f.is_file())  # the default: copies
    assert not (backups[0][0] / "jobs.owners").exists() and (backups[0][0] / "jobs.sqlite").exists()
    assert not list(tmp_path.glob(".backup*.tmp-*"))

    # restore: a real server on the backup answers from it
    dest = backups[1][0]
    server, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"],
                                                    env_for(dest, port)), tmp_path / "r.log")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc=server, timeout=30)  # its index is loaded in the background after /healthz answers
        assert httpx.get(f"{base}/v1/indexes/docs", headers=RKEY).json()["count"] == sizes[1]
        hit = httpx.post(f"{base}/v1/indexes/docs/search", headers=RKEY,
                         json={"vectors": row_of([sizes[1] - 1]).tolist(), "k": 1}).json()
        assert hit["results"][0][0]["id"] == sizes[1] - 1
        r = httpx.post(f"{base}/v1/maps/a2b@prod/transform", headers=RKEY, json={"vectors": [[0.5] * 16]})
        assert r.status_code == 200 and r.json()["shape"] == [1, 16]
    finally:
        stop(server)


def test_bad_destinations_and_a_missing_data_dir_are_one_line_and_write_nothing(source, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    r = cli("--data-dir", source, "backup", full)
    assert r.returncode == 2 and "already exists and is not empty" in r.stderr and "Traceback" not in r.stderr
    assert [p.name for p in full.iterdir()] == ["keep.txt"]

    r = cli("--data-dir", source, "backup", source / "snap")
    assert r.returncode == 2 and "inside the data dir" in r.stderr and not (source / "snap").exists()

    r = cli("--data-dir", tmp_path / "nothing-here", "backup", tmp_path / "b")
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "nothing-here").exists()

    (tmp_path / "home").mkdir()  # a folder that is not a data dir (a mistyped --data-dir): nothing to back up
    (tmp_path / "home" / "notes.txt").write_text("x")
    r = cli("--data-dir", tmp_path / "home", "backup", tmp_path / "b")
    assert r.returncode == 2 and "is not a vecbridge data dir" in r.stderr and not (tmp_path / "b").exists()

    empty = tmp_path / "empty"  # an existing empty folder is fine (a mount point made for it)
    empty.mkdir()
    r = cli("--data-dir", source, "backup", empty, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["indexes"]["docs"]["generation"] == 1


def test_a_failed_backup_leaves_no_destination(source, tmp_path):
    """An index that cannot be read stops the backup after other files were copied: no DEST, no temporary."""
    ids = np.arange(10)
    IndexStore(source / "indexes").create("zzz", "b", row_of(ids), ids=ids)
    (source / "indexes" / "zzz" / "meta.json").write_text("{not json")
    dest = tmp_path / "out" / "b1"
    r = cli("--data-dir", source, "backup", dest)
    assert r.returncode == 2 and "zzz" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not dest.exists() and list((tmp_path / "out").iterdir()) == []


def test_a_missing_index_file_is_named_not_an_internal_error(source, tmp_path):
    """A delta file removed from an index (an operator's slip, a partial restore): `vecbridge backup` failed with
    "internal error: RuntimeError: ... generations changed faster than they could be read" (exit 3) after eight
    tries on an unchanged meta.json. The file is missing, not racing a writer: one line naming it, exit 2."""
    ids = np.arange(10)
    IndexStore(source / "indexes").get("docs").add(row_of(ids + 512), ids=ids + 512)
    (source / "indexes" / "docs" / "delta.2.npz").unlink()
    r = cli("--data-dir", source, "backup", tmp_path / "b")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "index 'docs': its file delta.2.npz is missing" in r.stderr and "internal error" not in r.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("name", ["sqlite_autoindex_versions_1", "spaces"])
def test_a_damaged_registry_is_refused_by_name_and_leaves_no_destination(source, tmp_path, name):
    """A damaged page of registry.sqlite: the backup failed with "internal error: DatabaseError: the copy of
    registry.sqlite fails quick_check" (exit 3). Now one line naming the data dir's file and what to do, exit 2."""
    damage_page(source / "registry.sqlite", name)
    r = cli("--data-dir", source, "backup", tmp_path / "b")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{source / 'registry.sqlite'} is damaged" in r.stderr and "earlier backup" in r.stderr, r.stderr
    assert "internal error" not in r.stderr and not (tmp_path / "b").exists()


def test_verify_indexes_loads_each_copy_and_refuses_a_damaged_one(source, tmp_path):
    """``--verify-indexes`` loads every copied index as the service would: a snapshot whose bytes were damaged is
    copied as it is by default (nothing reads it), and refused with the option (no DEST); an intact one reports its
    row count. Before: no such option, so a backup could hold an index that does not load."""
    ids = np.arange(300)
    IndexStore(source / "indexes").create("ok", "b", row_of(ids), ids=ids)
    r = cli("--data-dir", source, "backup", tmp_path / "good", "--verify-indexes", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["indexes"]["ok"]["count"] == 300
    IndexStore(source / "indexes").create("bad", "b", row_of(ids), ids=ids)
    snap = next((source / "indexes" / "bad").glob("index.*.faiss"))
    raw = bytearray(snap.read_bytes())
    raw[len(raw) // 2:] = b"\xff" * (len(raw) - len(raw) // 2)
    snap.write_bytes(bytes(raw))
    assert cli("--data-dir", source, "backup", tmp_path / "plain", "--quiet").returncode == 0  # copied as it is
    dest = tmp_path / "out" / "checked"
    r = cli("--data-dir", source, "backup", dest, "--verify-indexes")
    assert r.returncode == 2 and "index 'bad' was copied but does not load" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not dest.exists() and list((tmp_path / "out").iterdir()) == []


def test_keys_checkpoints_and_reports_travel_with_their_modes(source, tmp_path):
    (source / "local-key").write_text("k" * 64)
    os.chmod(source / "local-key", 0o600)
    (source / "migrations").mkdir()
    (source / "migrations" / "a-to-b.json").write_text("{}")
    (source / "reports" / "a2b").mkdir(parents=True)
    (source / "reports" / "a2b" / "r.html").write_text("<html></html>")
    (source / "artifacts" / "tmp" / ".x.tmp-1").write_text("half")  # a writer's temporary: left out
    dest = tmp_path / "b"
    r = cli("--data-dir", source, "backup", dest, "--copy", "--json")
    assert r.returncode == 0, r.stderr
    assert (dest / "local-key").stat().st_mode & 0o777 == 0o600
    assert (dest / "migrations" / "a-to-b.json").read_text() == "{}"
    assert (dest / "reports" / "a2b" / "r.html").exists()
    assert not list((dest / "artifacts").rglob("*.tmp-*"))
    assert json.loads(r.stdout)["reports"] == 1


def test_a_postgresql_registry_backup_says_how_to_restore_it_and_gets_no_registry_of_its_own(source, tmp_path):
    """The restore line of a backup whose registry is PostgreSQL was `vecbridge --data-dir DEST serve`, as for SQLite:
    following it served a new empty SQLite registry in DEST (and seeded the demo into it), changing the backup. Now
    the line names the dump and --registry-url, and vecbridge refuses DEST without a registry URL (exit 2, naming
    backup.json and --registry-url), writing nothing there."""
    pg = "postgresql://vb:pw-4d1f@127.0.0.1:1/vb"  # never connected to: the registry's backup is pg_dump's
    dest = tmp_path / "b"
    r = cli("--data-dir", source, "--registry-url", pg, "backup", dest)
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if "restore:" in x]
    assert "pg_dump" in line and f"vecbridge --data-dir {dest} --registry-url postgresql://" in line, line
    assert "pw-4d1f" not in r.stdout
    # the note said every artifact an earlier dump names is in the backup: not so when a `registry gc` ran between
    (note,) = [x for x in r.stdout.splitlines() if "back it up with pg_dump" in x]
    assert "unless a `vecbridge registry gc` ran in between" in note and "before the dump or after" in note, note
    before = sorted(dest.rglob("*"))
    for args in (("registry", "list"), ("spaces", "add", "x", "--dim", "4")):
        r = cli("--data-dir", dest, *args)
        assert r.returncode == 2 and "backup.json" in r.stderr and "--registry-url" in r.stderr, r.stdout + r.stderr
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "service.cli", "serve"], cwd=ROOT, env=env_for(dest, port),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "backup.json" in r.stderr, r.stderr
    assert sorted(dest.rglob("*")) == before


@pytest.mark.postgres
def test_a_postgresql_registry_is_pg_dumps_job_and_restores_beside_the_backup(pg_url, tmp_path):
    """The documented order: pg_dump, then vecbridge backup (a live version's artifact is never removed, so every one
    the dump names is in the backup); restore: the dump into a new database, vecbridge on the backup with it. A
    `registry gc` between the two removed a version the dump holds deleted, not collected: `registry verify` of the
    restore called its file "missing or unreadable" and exited 2; it lists it apart (gc marks it collected)."""
    import psycopg

    from align import fit_procrustes

    data = tmp_path / "var"
    X = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    reg = open_registry(pg_url, data / "artifacts")
    try:
        for name in ("a", "b"):
            reg.register_space(name, 16)
        reg.register_version("a2b", fit_procrustes(X, X), source_space="a", target_space="b", method="procrustes",
                             params={}, alias="prod")
        reg.register_version("old", fit_procrustes(X, X[:, 1:]), source_space="a", target_space="c",
                             method="procrustes", params={})
        reg.delete_version("old", 1)
        dump = tmp_path / "registry.sql"
        subprocess.run(["pg_dump", "--no-owner", "-f", str(dump), pg_url], check=True, capture_output=True)
        assert reg.gc()["collected"]["maps"] == ["old:1"]  # between the dump and the backup: the note says so
        reg.register_version("a2b", fit_procrustes(X, X[:, ::-1].copy()), source_space="a", target_space="b",
                             method="procrustes", params={})  # after the dump: in the backup too, harmless
    finally:
        reg.close()
    dest = tmp_path / "b"
    r = cli("--data-dir", data, "--registry-url", pg_url, "backup", dest, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["registry"] == {"backend": "postgresql", "copied": False} and out["artifacts"] == 2
    assert "pg_dump" in out["notes"][0] and not (dest / "registry.sqlite").exists()
    r = cli("--data-dir", data, "--registry-url", pg_url, "backup", tmp_path / "b2")
    assert r.returncode == 0 and "note: the registry database is PostgreSQL: back it up with pg_dump" in r.stdout

    restored = pg_url.rsplit("/", 1)[0] + "/" + pg_url.rsplit("/", 1)[1] + "_restored"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{restored.rsplit("/", 1)[1]}"')
    try:
        subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(dump), restored], check=True,
                       capture_output=True)
        r = cli("--data-dir", dest, "--registry-url", restored, "registry", "verify")  # old:1 deleted, files gone
        assert r.returncode == 0 and json.loads(r.stdout)["n_versions"] == 2, r.stdout + r.stderr
        assert [x.split(":")[:2] for x in json.loads(r.stdout)["deleted_files_gone"]] == [["old", "1"]]
        r = cli("--data-dir", dest, "--registry-url", restored, "registry", "show", "a2b@prod", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["version"] == 1, r.stderr
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{restored.rsplit("/", 1)[1]}" WITH (FORCE)')


def test_an_interrupted_backup_leaves_no_destination(source, tmp_path):
    """Ctrl-C half-way through an index copy (raised from the progress callback, as the CLI's SIGINT would be):
    the temporary folder is removed and no DEST appears."""
    from service.config import Settings
    from service.ops.backup import backup_data_dir

    def progress(stage: str, fraction: float) -> None:
        if stage == "index docs" and 0 < fraction < 1:
            raise KeyboardInterrupt

    dest = tmp_path / "out" / "b"
    with pytest.raises(KeyboardInterrupt):
        backup_data_dir(Settings(data_dir=source), dest, link=False, progress=progress)
    assert list((tmp_path / "out").iterdir()) == []


KILLED_BACKUP = f"""
import os, signal, sys, time
from pathlib import Path
sys.path[:0] = [{str(Path(__file__).resolve().parents[3])!r}]
from service.config import Settings
from service.ops.backup import backup_data_dir

source, dest, hold = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if hold == "rename":  # kill -9 at the rename that makes the copy DEST: every file written and made durable
    rename = os.rename
    os.rename = lambda a, b: os.kill(os.getpid(), signal.SIGKILL) if Path(b) == dest else rename(a, b)

def progress(stage, fraction):
    if stage == "index docs" and 0 < fraction < 1 and hold != "rename":
        if hold == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9 half-way through an index copy
        (dest.parent / "holding").touch()
        while not (dest.parent / "release").exists():  # a backup still running
            time.sleep(0.05)

backup_data_dir(Settings(data_dir=source), dest, progress=progress)
"""


def test_a_killed_backups_folder_is_removed_by_the_next_and_a_running_ones_is_kept(source, tmp_path):
    """``kill -9`` of a backup half-way leaves its ``.DEST.tmp-*`` folder (nothing can remove it then); the next
    backup into the same parent folder removes it and says so. A backup still running keeps its folder (its lock is
    held), and a folder that is not a backup's is never touched. Before: killed backups' folders stayed forever."""
    out = tmp_path / "out"
    script = tmp_path / "killed_backup.py"
    script.write_text(KILLED_BACKUP)
    r = subprocess.run([sys.executable, str(script), str(source), str(out / "b1"), "kill"], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == -9, r.stderr
    left = [p.name for p in out.iterdir()]
    assert len(left) == 1 and left[0].startswith(".b1.tmp-"), left
    stranger = out / ".notes.tmp-0123abcd"  # someone else's temporary folder, no marker
    stranger.mkdir()
    running = subprocess.Popen([sys.executable, str(script), str(source), str(out / "b2"), "hold"],
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (out / "holding").exists():
            assert running.poll() is None and time.time() < deadline, running.stderr.read()
            time.sleep(0.05)
        names = {p.name for p in out.iterdir()}
        assert left[0] not in names and stranger.name in names, names  # b2 removed the killed one's folder
        r = cli("--data-dir", source, "backup", out / "b3", "--json")  # while b2 is still running
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["notes"] == []
        names = {p.name for p in out.iterdir()}
        assert stranger.name in names and "b3" in names
        assert any(n.startswith(".b2.tmp-") for n in names), names  # the running backup's folder is kept
        (out / "release").touch()
        assert running.wait(timeout=120) == 0, running.stderr.read()
    finally:
        running.kill()
    notes = json.loads((out / "b2" / "backup.json").read_text())["notes"]
    assert any(left[0] in n and "killed" in n for n in notes), notes
    assert not (out / "b2" / ".vecbridge-backup-in-progress").exists()  # the marker is not part of a backup
    assert IndexStore(out / "b2" / "indexes").get("docs").count == 512  # the held backup completed whole
    assert cli("--data-dir", out / "b2", "registry", "verify").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == [".notes.tmp-0123abcd", "b2", "b3", "holding", "release"]


def test_the_summary_counts_steer_versions_beside_map_versions(source, tmp_path):
    """A steer's artifact was counted among the artifacts but the summary named map versions only ("1 map versions),
    3 artifacts"): it now says how many steer versions the copied registry holds, and verify reports both counts."""
    from align.steer import MeanShift

    reg = open_registry(f"sqlite:///{source / 'registry.sqlite'}", source / "artifacts")
    dim = reg.get_space("b").dim
    for _ in range(2):
        reg.register_steer("toward", MeanShift(np.ones(dim, np.float32) / dim), space="b")
    reg.close()
    r = cli("--data-dir", source, "backup", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    assert "1 map versions, 2 steer versions)" in r.stdout, r.stdout
    out = json.loads(cli("--data-dir", tmp_path / "b", "registry", "verify").stdout)
    assert (out["ok"], out["n_versions"], out["n_steer_versions"]) == (True, 1, 2)


def test_the_printed_restore_commands_work_as_pasted_from_a_path_with_a_space(source, tmp_path, capsys):
    """The "restore:" line printed DEST as it is: `vecbridge --data-dir my backups/b serve` pasted into a shell gave
    --data-dir 'my' and two stray arguments. Now DEST is quoted for the shell; the check command runs as printed."""
    import shlex

    from conftest import run_cli

    dest = tmp_path / "my backups" / "b é"
    code, out, err = run_cli(capsys, "--data-dir", source, "backup", dest, "--quiet")
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if "restore:" in x]
    serve, check = line.split("restore:")[1].split("(check:")
    assert shlex.split(serve) == ["vecbridge", "--data-dir", str(dest), "serve"], line
    words = shlex.split(check.rstrip(") "))
    assert words[:3] == ["vecbridge", "--data-dir", str(dest)], line
    code, out, err = run_cli(capsys, *words[1:])
    assert code == 0 and json.loads(out)["ok"], err


def test_a_backup_killed_at_its_final_rename_is_removed_by_the_next(source, tmp_path):
    """The marker was removed before the last fsyncs and the rename: a backup killed there left a whole unmarked
    copy of the data dir (its local key too) that no later backup removed. Now the marker goes after the rename."""
    out = tmp_path / "out"
    script = tmp_path / "killed_backup.py"
    script.write_text(KILLED_BACKUP)
    r = subprocess.run([sys.executable, str(script), str(source), str(out / "b1"), "rename"], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == -9, r.stderr
    (left,) = [p for p in out.iterdir()]
    assert left.name.startswith(".b1.tmp-") and (left / "backup.json").exists()
    r = cli("--data-dir", source, "backup", out / "b1", "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["b1"], list(out.iterdir())
    assert not (out / "b1" / ".vecbridge-backup-in-progress").exists()
