"""Where a migration records how far it got: a JSON file or a PostgreSQL table.

The state is a small JSON object (see :class:`~service.vectordb.migrate.MigrationState`):
source, target, map fingerprint, the id range already written (``first_id`` … ``last_id``,
ascending scan order), rows and batches done, and whether it finished. It is written **after**
each batch's upsert, so a crash can only lose the record of the last batch, never rows: the
resumed run rewrites that batch, and the idempotent upsert keeps one row per id.
"""

from __future__ import annotations

import json
from pathlib import Path

from align.exceptions import InputError

from ..storage import atomic_write
from .base import CheckpointMismatchError, check_name

__all__ = ["Checkpoint", "FileCheckpoint", "PgCheckpoint", "MemoryCheckpoint"]


class Checkpoint:
    """Interface: ``load() -> dict | None``, ``save(state: dict)``, ``clear()``."""

    def load(self) -> dict | None:  # pragma: no cover - interface
        raise NotImplementedError

    def save(self, state: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def clear(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class MemoryCheckpoint(Checkpoint):
    """Keeps the state in memory (resume within one process; tests)."""

    def __init__(self):
        self.state: dict | None = None

    def load(self):
        return None if self.state is None else dict(self.state)

    def save(self, state):
        self.state = dict(state)

    def clear(self):
        self.state = None


class FileCheckpoint(Checkpoint):
    """A JSON file replaced atomically (write a temporary file, fsync, rename)."""

    def __init__(self, path):
        self.path = Path(path)
        if self.path.is_dir():
            raise InputError(f"checkpoint {self.path} is a directory; give a file path, e.g. {self.path / 'run.json'}")
        if self.path.exists() and not self.path.is_file():
            raise InputError(f"checkpoint {self.path} is not a regular file")

    def load(self):
        try:
            state = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointMismatchError(f"checkpoint {self.path} is not a migration checkpoint (not JSON); "
                                          "move it away to start afresh") from None
        if not isinstance(state, dict) or not {"source", "target", "map_fingerprint", "last_id"} <= set(state):
            raise CheckpointMismatchError(f"checkpoint {self.path} is not a migration checkpoint")
        return state

    def save(self, state):
        atomic_write(self.path, json.dumps(state, sort_keys=True))

    def clear(self):
        self.path.unlink(missing_ok=True)


class PgCheckpoint(Checkpoint):
    """A row of ``vecbridge_migrations (key text primary key, state jsonb, updated_at)`` in PostgreSQL.

    ``key`` names the migration (default ``"<source>-><target>"`` chosen by the caller).
    """

    def __init__(self, url: str, key: str, *, table: str = "vecbridge_migrations"):
        import psycopg

        self.key = key
        self.table = check_name(table, "table")
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} "
                          "(key text PRIMARY KEY, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())")

    def load(self):
        r = self.conn.execute(f"SELECT state FROM {self.table} WHERE key = %s", (self.key,)).fetchone()
        return None if r is None else dict(r[0])

    def save(self, state):
        from psycopg.types.json import Jsonb

        self.conn.execute(f"INSERT INTO {self.table} (key, state) VALUES (%s, %s) ON CONFLICT (key) "
                          "DO UPDATE SET state = EXCLUDED.state, updated_at = now()", (self.key, Jsonb(state)))

    def clear(self):
        self.conn.execute(f"DELETE FROM {self.table} WHERE key = %s", (self.key,))

    def close(self):
        self.conn.close()
