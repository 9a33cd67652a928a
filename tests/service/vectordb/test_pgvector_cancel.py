"""A cancel sent to a pgvector server that stopped answering (real PostgreSQL + pgvector: ``.ci/start_vectordbs.sh``
or the pgserver wheel)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _vectordb_servers import pg_url  # noqa: F401  (module-scoped server fixture)

pytest.importorskip("psycopg")

ROOT = Path(__file__).resolve().parents[3]

_INTERRUPT_CUT_OFF = """
import asyncio, sys, threading
from urllib.parse import quote
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from psycopg.conninfo import conninfo_to_dict
from test_registry_outage import Forwarder
from service.vectordb import PgVectorStore


class ToServer(Forwarder):  # the server's TCP port, or its socket file (the pgserver wheel listens on one only)
    async def _client(self, reader, writer):
        host, port = self.target
        if host.startswith("/"):
            up_reader, up_writer = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        else:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))


info = conninfo_to_dict(sys.argv[1])
fwd = ToServer((info.get("host") or "/tmp", int(info.get("port") or 5432)))
fwd.open()
user, password = quote(info.get("user") or "postgres", safe=""), quote(info.get("password") or "", safe="")
store = PgVectorStore(f"postgresql://{user}:{password}@127.0.0.1:{fwd.port}/{info.get('dbname') or 'postgres'}")
fwd.held = True  # cut off: the server's bytes stop, and so do those of the cancel request (same host and port)
done = threading.Event()
threading.Thread(target=lambda: (store.interrupt(), done.set()), daemon=True).start()
print("returned" if done.wait(45) else "blocked", flush=True)
"""


def test_a_cancel_sent_to_a_cut_off_database_gives_up_and_the_process_goes_on(pg_url):  # noqa: F811
    """A Ctrl-C or a job's cancel during a migration's finalize cancels the statement (``interrupt``); psycopg's
    ``cancel()`` blocks, holding the GIL, for as long as the server keeps the cancel request unanswered: the whole
    process froze (the service's event loop, its health checks, a second Ctrl-C). ``cancel_safe`` gives up after
    5 s. In a child process: a frozen one would take the test worker with it."""
    cmd = [sys.executable, "-c", _INTERRUPT_CUT_OFF, pg_url, str(ROOT / "tests"),
           str(ROOT / "tests" / "service" / "api")]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the process froze in interrupt(): nothing ran for 90 s")
    assert done.stdout.strip() == "returned", (done.stdout, done.stderr[-2000:])
