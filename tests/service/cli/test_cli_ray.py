"""`vecbridge fit --ray`: the Ray map-reduce fit registers the same map as the in-process fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")


def _vecbridge(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "service.cli", "--data-dir", str(data_dir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_fit_with_ray_equals_in_process_fit(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 16)).astype(np.float32)
    Q = np.linalg.qr(rng.normal(size=(16, 16)))[0]
    Y = (X @ Q + 0.1 * rng.normal(size=X.shape)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    common = ["fit", "--pairs", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy"),
              "--method", "procrustes", "--quiet", "--json"]
    local = _vecbridge(tmp_path / "var", *common, "--name", "plain")
    assert local.returncode == 0, local.stderr
    distributed = _vecbridge(tmp_path / "var", *common, "--name", "viaray", "--ray", "--shard-rows", "1000")
    assert distributed.returncode == 0, distributed.stderr
    assert distributed.stderr == ""  # --quiet: not Ray's "Started a local Ray instance" and warnings either

    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{tmp_path / 'var' / 'registry.sqlite'}", tmp_path / "var" / "artifacts")
    a, b = reg.load_map("plain"), reg.load_map("viaray")
    assert np.abs(a.W - b.W).max() < 1e-5
    assert b.metadata.get("distributed", {}).get("engine") == "ray"
    assert b.metadata["distributed"]["n_shards"] == 3  # --shard-rows 1000 over 3,000 rows
    # the workers' peak memory stays out of the artifact (same fit, same bytes): the version's metrics record it
    recorded = reg.resolve("viaray").metrics["distributed"]
    assert recorded["n_shards"] == 3 and recorded["worker_peak_rss_mb"] > 0
    assert json.loads(distributed.stdout)


def test_minivec2vec_with_ray_registers_the_in_process_map(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(700, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", X[rng.permutation(700)] @ np.linalg.qr(rng.normal(size=(8, 8)))[0].astype(np.float32))
    common = ["fit", "--unpaired", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy"),
              "--method", "minivec2vec", "--param", "n_anchor_runs=2", "--param", "refine1_iters=3",
              "--param", "n_clusters=8", "--quiet",
              "--allow-unreliable"]  # isotropic Gaussian rows: no structure to align, rightly flagged
    local = _vecbridge(tmp_path / "var", *common, "--name", "plain")
    assert local.returncode == 0, local.stderr
    distributed = _vecbridge(tmp_path / "var", *common, "--name", "viaray", "--ray")
    assert distributed.returncode == 0, distributed.stderr
    assert "Traceback" not in distributed.stderr

    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{tmp_path / 'var' / 'registry.sqlite'}", tmp_path / "var" / "artifacts")
    a, b = reg.load_map("plain:1"), reg.load_map("viaray:1")  # flagged: a bare name means none of them
    np.testing.assert_array_equal(a.W, b.W)
    assert reg.get_version("viaray", 1).metrics["executor"] == "ray"  # recorded with the fit, not in the artifact
    assert reg.get_version("viaray", 1).artifact_sha256 == reg.get_version("plain", 1).artifact_sha256
    threaded = _vecbridge(tmp_path / "var", *common, "--name", "threads", "--threads", "2")
    assert threaded.returncode == 0, threaded.stderr
    c = reg.load_map("threads:1")
    np.testing.assert_array_equal(a.W, c.W)  # the kNN / CSLS blocks on two threads: the same map
    assert reg.get_version("threads", 1).metrics["executor"] == "threads:2"
    assert reg.get_version("threads", 1).artifact_sha256 == reg.get_version("plain", 1).artifact_sha256
    bad = _vecbridge(tmp_path / "var", *common, "--name", "nothreads", "--threads", "0")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_kill_9_of_a_ray_fit_leaves_no_ray_process(tmp_path):
    """Issue 15 #11: ``ray::DashboardAgent`` and the RuntimeEnvAgent outlived a driver killed with -9."""
    import os
    import signal
    import time

    psutil = pytest.importorskip("psutil")
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200_000, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", X[:, ::-1].copy())
    cmd = [sys.executable, "-m", "service.cli", "--data-dir", str(tmp_path / "var"), "fit", "--pairs", "--source",
           str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy"), "--method", "procrustes", "--name", "k",
           "--quiet", "--ray", "--shard-rows", "500"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict[int, psutil.Process] = {}
    names: dict[int, str] = {}

    def look():
        try:
            for c in psutil.Process(p.pid).children(recursive=True):
                seen[c.pid] = c
                names[c.pid] = names.get(c.pid) or _cmd(c)
        except psutil.Error:
            pass

    deadline = time.time() + 240
    try:
        while time.time() < deadline and p.poll() is None:  # until Ray's agents are up
            look()
            every = " ".join(names.values())
            if "raylet" in every and "agent" in every.lower():
                time.sleep(1.0)  # let the raylet start its other agents too
                look()
                break
            time.sleep(0.2)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    if not any("raylet" in n for n in names.values()):
        pytest.skip(f"the fit ended before Ray's agents were seen (exit {p.returncode}, seen "
                    f"{[n[:60] for n in names.values()]})")
    deadline = time.time() + 30
    while time.time() < deadline and _alive(seen.values()):
        time.sleep(0.5)
    left = _alive(seen.values())
    for c in left:
        c.kill()
    assert not left, f"left running after kill -9: {[names.get(c.pid, '?')[:80] for c in left]}"


def _cmd(c) -> str:
    try:
        return " ".join(c.cmdline())
    except Exception:  # noqa: BLE001 - gone or a zombie
        return ""


def _alive(procs) -> list:
    import psutil

    out = []
    for c in procs:
        try:
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
        except psutil.Error:
            pass
    return out


@pytest.mark.parametrize("method", ["procrustes", "cluster"])  # a LinearMap and an align.ClusterMap
def test_transform_with_ray_streams_the_same_output(tmp_path, method):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(1000, 8)).astype(np.float32)
    Y = X @ np.linalg.qr(rng.normal(size=(8, 8)))[0].astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    fit = _vecbridge(tmp_path / "var", "fit", "--pairs", "--source", str(tmp_path / "x.npy"), "--target",
                     str(tmp_path / "y.npy"), "--method", method, "--name", "m", "--quiet", "--json")
    assert fit.returncode == 0, fit.stderr
    assert json.loads(fit.stdout)["map_kind"] == ("cluster" if method == "cluster" else "linear")
    common = ["transform", "--map", "m", str(tmp_path / "x.npy")]
    a = _vecbridge(tmp_path / "var", *common, str(tmp_path / "a.npy"), "--chunk-rows", "128", "--quiet")
    b = _vecbridge(tmp_path / "var", *common, str(tmp_path / "b.npy"), "--chunk-rows", "128", "--quiet", "--ray")
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert b.stderr == "", b.stderr  # --quiet keeps Ray's own console lines away too
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))  # 8 chunks, in order
    # the re-embedded rows kept (blocks from Ray are read-only: "assignment destination is read-only", exit 3)
    rows = np.array([999, 5, 130, 127, 128])  # across chunk edges
    np.save(tmp_path / "rows.npy", rows)
    np.save(tmp_path / "kv.npy", Y[rows])
    c = _vecbridge(tmp_path / "var", *common, str(tmp_path / "c.npy"), "--chunk-rows", "128", "--quiet", "--ray",
                   "--keep-rows", str(tmp_path / "rows.npy"), "--keep-vectors", str(tmp_path / "kv.npy"))
    assert c.returncode == 0, c.stderr
    want = np.load(tmp_path / "a.npy")
    want[rows] = Y[rows] / np.linalg.norm(Y[rows], axis=1, keepdims=True)
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), want, rtol=1e-5, atol=1e-6)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _registered(data_dir: Path) -> list[str]:
    from service.registry import open_registry

    if not (data_dir / "registry.sqlite").exists():
        return []
    reg = open_registry(f"sqlite:///{data_dir / 'registry.sqlite'}", data_dir / "artifacts")
    return [m["name"] for m in reg.list_maps()]


def test_a_wrong_ray_address_is_one_error_in_seconds_and_leaves_nothing(tmp_path):
    """Session 16: ``--ray 127.0.0.1:<nothing there>`` sat in ``ray.init`` for over 5 minutes (Ray retries a dead
    GCS ~20 times, ~40 s each); a typo like ``--ray headnode`` was an ``internal error: ValueError`` (exit 3)."""
    import time

    rng = np.random.default_rng(3)
    X = rng.normal(size=(500, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", X[:, ::-1].copy())
    var = tmp_path / "var"
    ok = _vecbridge(var, "fit", "--pairs", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy"),
                    "--method", "procrustes", "--name", "m", "--quiet")
    assert ok.returncode == 0, ok.stderr
    fit = ["fit", "--pairs", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy"),
           "--method", "procrustes", "--name", "viaray", "--quiet"]
    transform = ["transform", "--map", "m", str(tmp_path / "x.npy"), str(tmp_path / "out" / "t.npy"), "--quiet"]
    dead = f"127.0.0.1:{_free_port()}"
    for args, address, says in ((fit, dead, "no Ray cluster at"), (transform, dead, "no Ray cluster at"),
                                (fit, "headnode", "HOST:PORT"), (transform, f"ray://{dead}", "no Ray cluster at")):
        t0 = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-m", "service.cli", "--data-dir", str(var), *args, "--ray", address],
                               check=False, capture_output=True, text=True, timeout=150)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{args[0]} --ray {address} still waiting after 150 s")
        assert time.monotonic() - t0 < 60, (args[0], address)
        assert r.returncode == 2, (args[0], address, r.stderr[-800:])
        assert says in r.stderr and "Traceback" not in r.stderr, r.stderr[-800:]
    assert _registered(var) == ["m"]  # nothing registered by the failed fits
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())  # no output, no .part file


def test_a_local_ray_fit_ignores_the_cluster_a_stopped_ray_start_recorded(tmp_path):
    """``--ray`` (a local Ray) called ``ray.init()`` with no address, which joins the cluster this machine's last
    ``ray start`` recorded in ``<ray tmp>/ray_current_cluster``: after that head stopped without ``ray stop`` (a
    crash, a kill), the fit sat in Ray's GCS retries for minutes (seen in session 32). Now it starts its own."""
    import shutil
    import tempfile
    import time

    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    ray_tmp = Path(tempfile.mkdtemp(prefix="vb-ray-", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        (ray_tmp / "ray").mkdir()
        (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_free_port()}")  # nothing there
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "RAY_TMPDIR": str(ray_tmp)}
        t0 = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-m", "service.cli", "--data-dir", str(tmp_path / "var"), "fit",
                                "--pairs", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "x.npy"),
                                "--method", "procrustes", "--name", "m", "--quiet", "--ray"],
                               env=env, check=False, capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail("fit --ray still waiting after 240 s: it joined the stopped cluster")
        assert r.returncode == 0, r.stderr[-800:]
        assert time.monotonic() - t0 < 180
        assert _registered(tmp_path / "var") == ["m"]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_ray_not_installed_is_a_clear_error(tmp_path):
    """Without the ``ray`` extra, ``--ray`` was ``internal error: ImportError`` (exit 3, the code for a bug)."""
    np.save(tmp_path / "x.npy", np.random.default_rng(4).normal(size=(100, 4)).astype(np.float32))
    hide_ray = ("import sys; sys.modules['ray'] = None  # as on an install without the ray extra\n"
                "from service.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", hide_ray, "--data-dir", str(tmp_path / "var"), "fit", "--pairs",
                        "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "x.npy"), "--method",
                        "procrustes", "--name", "m", "--quiet", "--ray"],
                       check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Ray is not installed" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert _registered(tmp_path / "var") == []


def test_a_cluster_with_token_authentication_says_what_to_set(tmp_path):
    """A real head started with ``RAY_AUTH_MODE=token``. Before: ``--ray HOST:PORT`` printed Ray's
    "Authentication token is missing or incorrect" warning once a second for ~20 s and ended with only "could not
    connect to Ray ... Failed to connect to Ray cluster". Now: no token mode here, or a wrong token, is one line
    naming what to set (exit 2, in seconds, nothing registered); the right token works."""
    import secrets
    import shutil
    import time

    token, port = secrets.token_hex(32), _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    head_env = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", "--port", str(port), "--num-cpus", "1",
                             "--include-dashboard=false", "--disable-usage-stats"], env=head_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        rng = np.random.default_rng(4)
        X = rng.normal(size=(400, 8)).astype(np.float32)
        np.save(tmp_path / "x.npy", X)
        var = tmp_path / "var"
        fit = ["fit", "--pairs", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "x.npy"),
               "--method", "procrustes", "--quiet", "--ray", f"127.0.0.1:{port}"]
        def run(name: str, extra: dict, timeout: float = 150) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "service.cli", "--data-dir", str(var), *fit, "--name", name],
                                  env={**base, **extra}, capture_output=True, text=True, timeout=timeout, check=False)

        deadline = time.monotonic() + 60
        while True:  # until the head's GCS is up: then no token mode here is one line naming what to set
            t0 = time.monotonic()
            r = run("a", {})
            if "requires token authentication: set RAY_AUTH_MODE=token" in r.stderr or time.monotonic() > deadline:
                break
            time.sleep(1)
        for case, extra in enumerate(({}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})):
            if case:
                t0, r = time.monotonic(), run("a", extra)
            says = ("refused the token given" if case else "requires token authentication: set RAY_AUTH_MODE=token")
            assert r.returncode == 2 and says in r.stderr, r.stderr[-800:]
            assert len(r.stderr.strip().splitlines()) == 1 and time.monotonic() - t0 < 30, r.stderr[-800:]
        assert _registered(var) == []
        r = run("b", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}, timeout=300)
        assert r.returncode == 0, r.stderr[-800:]
        assert _registered(var) == ["b"]
    finally:
        os.killpg(head.pid, 15)
        head.wait(timeout=60)
        # `ray start` records the head as this machine's current cluster: left there, a bare ray.init() (not
        # vecbridge's: it starts a local Ray with address="local") would try to join the stopped head
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()
