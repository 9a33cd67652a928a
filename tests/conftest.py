"""Shared fixtures: the WordNet benchmark data when present, a small fallback otherwise; a fresh
PostgreSQL database (``pg_url``) and a registry URL on each backend (``registry_url``)."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings as _hypothesis_settings

# No per-example wall-clock deadline (hypothesis's default is 200 ms): on a loaded shared machine it failed
# examples for their speed, which the benchmarks measure, not the tests.
# Examples drawn from a fixed seed (derandomize): a commit's run gives the same result on every machine, so a clean
# CI run here predicts the project's CI (one example in ~10^4 of a float32 tolerance failed 1 run in ~500 by chance).
# `pytest --hypothesis-profile=explore` draws new examples each run, to look for such cases on purpose.
_hypothesis_settings.register_profile("vecbridge", deadline=None, derandomize=True)
_hypothesis_settings.register_profile("explore", deadline=None)
_hypothesis_settings.load_profile("vecbridge")

WORDNET = Path(os.environ.get("VECBRIDGE_WORDNET_DIR", Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wordnet"))


@pytest.fixture(scope="session", autouse=True)
def _search_device():
    """``VECBRIDGE_TEST_SEARCH_DEVICE=cuda`` (the GPU machine's run; ``torch-cpu``: the same code on torch's CPU):
    every flat index searched in the test process goes through the GPU path (service/indexes/device.py), so the
    index tests hold it to their FAISS expectations. Unset (CI): FAISS, as a server searches by default."""
    name = os.environ.get("VECBRIDGE_TEST_SEARCH_DEVICE")
    if not name:
        yield
        return
    import service.indexes.device as dev

    if name == "torch-cpu":  # the same path on torch's CPU: a machine without a GPU checks it against the suite
        import torch

        dev._device = torch.device("cpu")
    else:
        dev.use_device(name)
    yield
    dev.use_device("cpu")


def wordnet_available() -> bool:
    return (WORDNET / "minilm.npy").exists() and (WORDNET / "e5.npy").exists()


@contextlib.contextmanager
def logged(name: str, level: int | str = logging.WARNING):
    """The records logger ``name`` (and its children) emits at ``level`` or above inside the block, as a list.

    A handler on the logger itself: pytest's ``caplog`` listens at the root, which ``configure_logging`` (run by any
    server or CLI test earlier in the same worker) cuts the ``vecbridge`` tree off from, so a caplog test passed or
    failed by test order (CI failed three such tests, one at a time)."""
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(level)
    handler.emit = seen.append  # type: ignore[method-assign]
    log = logging.getLogger(name)
    old = log.level
    log.addHandler(handler)
    if log.getEffectiveLevel() > handler.level:
        log.setLevel(handler.level)
    try:
        yield seen
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """``vecbridge ARGS`` in this process (``service.cli.main``): ``(exit code, stdout, stderr)``."""
    import logging

    from service.cli import main

    # the loggers as a fresh ``vecbridge`` process has them (nothing configured: warnings only, plain text). An app
    # built earlier in this worker (``create_app``, a module fixture too) sends INFO lines to stderr, and CI's
    # ``--json`` test saw ``index loaded`` there, which the command run as a process never prints.
    saved = []
    for name in ("vecbridge", "uvicorn"):
        log = logging.getLogger(name)
        saved.append((log, log.handlers, log.level, log.propagate))
        log.handlers, log.propagate = [], True
        log.setLevel(logging.NOTSET)
    try:
        code = main([str(a) for a in args])
    finally:
        for log, handlers, level, propagate in saved:
            log.handlers, log.propagate = handlers, propagate
            log.setLevel(level)
    out, err = capsys.readouterr()
    return code, out, err


def run_cli_on_a_terminal(*args) -> tuple[int, str, str]:
    """``vecbridge ARGS`` as a process (``python -m service.cli``) whose stderr is an 80-column pseudo-terminal, where
    the progress bars are drawn (on a pipe or file they are not; tqdm draws nothing on a 0-column one, as a fresh
    pty is): ``(exit code, stdout, stderr)``."""
    import fcntl
    import struct
    import subprocess
    import sys
    import termios
    import threading

    from _servers import ROOT

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    got = bytearray()

    def drain():
        try:
            for chunk in iter(lambda: os.read(master, 4096), b""):
                got.extend(chunk)
        except OSError:  # EIO: the child ended and closed the terminal's last writer
            pass

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        p = subprocess.run([sys.executable, "-m", "service.cli", *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=slave, text=True, timeout=300, check=False)
    finally:
        os.close(slave)
    t.join(timeout=30)
    os.close(master)
    return p.returncode, p.stdout, got.decode(errors="replace")


def load_benchmark(name: str):
    """The module ``benchmarks/<name>.py`` (benchmarks are scripts, not a package; their siblings import by name)."""
    import importlib.util
    import sys

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(bench))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(bench))
    return mod


#: rows of the WordNet sample the tests embed themselves when the shared set is absent
SAMPLE_ROWS = 4096


@pytest.fixture(scope="session")
def wordnet_dir() -> Path:
    """The shared WordNet folder, or (absent) a sample of ``SAMPLE_ROWS`` definitions embedded here by the real
    MiniLM and e5 encoders in the same layout (``benchmarks/wordnet_sample.py``; cached, built once under a lock
    by parallel workers). Skips only when neither can be had (no wordnet-base, no encoder wheels)."""
    ws = load_benchmark("wordnet_sample")
    try:
        return ws.wordnet_dir(("minilm", "e5"), rows=SAMPLE_ROWS, shared=WORDNET)
    except (ws.SampleUnavailable, ImportError) as e:
        pytest.skip(f"no shared WordNet set and no sample: {e}")


@pytest.fixture(scope="session")
def wordnet(wordnet_dir):
    """dict name -> float16 array (n, d) (mmap) of the WordNet embeddings: the shared set's 40,960 rows with all
    four encoders, or the fallback sample's rows with minilm and e5; row i of every array embeds text i."""
    out = {}
    for name in ("minilm", "e5", "paraphrase_l3", "glove"):
        p = wordnet_dir / f"{name}.npy"
        if p.exists():
            out[name] = np.load(p, mmap_mode="r")
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(0)


PG_URL = os.environ.get("VECBRIDGE_TEST_POSTGRES_URL")


@pytest.fixture
def pg_url():
    """A fresh database on the test PostgreSQL server (dropped afterwards), or skip without
    ``VECBRIDGE_TEST_POSTGRES_URL`` (``eval "$(bash .ci/start_postgres.sh)"``)."""
    if not PG_URL:
        pytest.skip("VECBRIDGE_TEST_POSTGRES_URL is not set (eval \"$(bash .ci/start_postgres.sh)\")")
    import psycopg

    name = f"vb_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=10) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield PG_URL.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=10) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def registry_url(request, tmp_path):
    """A registry database URL: SQLite in ``tmp_path``, then a fresh PostgreSQL database (see ``pg_url``)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/registry.sqlite"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def reg(registry_url, tmp_path):
    """An open registry on each backend (see ``registry_url``), artifacts under ``tmp_path``."""
    from service.registry import open_registry

    r = open_registry(registry_url, tmp_path / "artifacts")
    yield r
    r.close()


@pytest.fixture
def client_kind(request) -> str:
    """Which Python client a test runs: ``"sync"`` (``Client``) unless parametrized ``indirect`` with
    ``_clients.CLIENT_KINDS`` (``"async"``: ``AsyncClient`` behind a blocking face)."""
    return getattr(request, "param", "sync")


@pytest.fixture
def client_cls(client_kind):
    """The class of :func:`client_kind`: ``service.client.Client`` or ``_clients.BlockingAsyncClient``."""
    from _clients import CLIENTS

    return CLIENTS[client_kind]


@pytest.fixture
def run_threads():
    """``run(fn, n)``: ``fn(0) .. fn(n-1)`` in ``n`` threads at once; their results in order (first error re-raised)."""

    def run(fn, n: int) -> list:
        with ThreadPoolExecutor(n) as ex:
            return list(ex.map(fn, range(n)))

    return run


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.slow`` tests are opt-in: ``pytest -m slow`` or ``VECBRIDGE_RUN_SLOW=1``; they get an hour
    before pytest-timeout stops them, not the suite's 15 min (``timeout`` in pyproject.toml)."""
    for item in items:
        if "slow" in item.keywords and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(3600))
    if "slow" in (config.getoption("-m") or "") or os.environ.get("VECBRIDGE_RUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="opt-in: pytest -m slow (or VECBRIDGE_RUN_SLOW=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


_STDERR: list[int] = []  # this process's stderr as pytest found it (not the capture): where a hung worker's stacks go


def pytest_configure(config):
    _STDERR.append(os.dup(2))  # as pytest's faulthandler plugin does, at configure time


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test stuck in C code (a lock inside a native library, as OpenBLAS's fork handler was) never returns to
    Python, so pytest-timeout's signal cannot fail it, and CI hung to its own limit saying nothing. A minute after
    the test's timeout, faulthandler's thread (no GIL needed) prints every thread's stack and ends this worker:
    xdist reports it crashed while running that test, and does not run it again (``--max-worker-restart 0``,
    Makefile). A test whose limit is of its call alone (``timeout(..., func_only=True)``: the README's walk-through,
    whose setup may embed the WordNet sample first) has the default limit on its setup and its teardown, its own on
    the call (:func:`pytest_runtest_call`)."""
    limit = _limit(item, call=False)
    if limit > 0:
        faulthandler.dump_traceback_later(limit + 60, exit=True, file=_STDERR[0])
    try:
        yield
    finally:
        if limit > 0:
            faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """The watchdog of a ``func_only`` test's call: its own limit, from the call's start; the default again after."""
    own, default = _limit(item, call=True), _limit(item, call=False)
    if own != default and own > 0:
        faulthandler.dump_traceback_later(own + 60, exit=True, file=_STDERR[0])
    try:
        yield
    finally:
        if own != default and default > 0:
            faulthandler.dump_traceback_later(default + 60, exit=True, file=_STDERR[0])


def _limit(item, *, call: bool) -> float:
    """The test's timeout in seconds (0: none): its marker's, else the ini's; a ``func_only`` marker's only for the
    call, the ini's for the other phases."""
    marker, default = item.get_closest_marker("timeout"), float(item.config.getini("timeout") or 0)
    if marker is None or not marker.args or (marker.kwargs.get("func_only") and not call):
        return default
    return float(marker.args[0])
