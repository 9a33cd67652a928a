"""A pgvector table's vector index as vecbridge builds it and searches it.

- :data:`METRIC_OPS` — the distance operator a search orders by: the table's metric's own (``<=>`` cosine, ``<#>``
  inner product, ``<->`` L2), whatever operator class its vector index has. PostgreSQL walks an index of that
  operator class where there is one (a cosine index beside an L2 one, whatever their names); an index of another
  (a cosine target that kept its L2 source's ``vector_l2_ops`` index for its users' ``<->`` queries) is not used and
  every row is read. Ordering by the index's operator instead ranked as cosine only on unit rows, which nothing
  keeps: a row the application writes later (``3 * q``), or a user's cosine table of rows of varied norms, was
  ranked by norm as much as by direction.
- :func:`build_index` — ``CREATE INDEX IF NOT EXISTS``, waiting at most :data:`INDEX_WAIT_S` for another session's
  lock on the table: a run killed (``kill -9``) during its index build leaves its ``CREATE INDEX`` running on the
  server to its end, and the rerun's build waited for it however long that took. Past the wait:
  :class:`IndexBuildBusyError` (exit 75, "retry later"), naming the other build's pid.
"""

from __future__ import annotations

from .base import VectorDBUnavailableError
from .pg_schema import DISTANCE_OPS

__all__ = ["INDEX_WAIT_S", "IndexBuildBusyError", "METRIC_OPS", "build_index"]

#: the longest a build waits for another session's lock on its table (the setting ``vectordb_index_wait_s``)
INDEX_WAIT_S = 60.0
#: each metric's own distance operator: the one a search of a table of that metric orders by
METRIC_OPS = {"cosine": "<=>", "ip": "<#>", **DISTANCE_OPS}
#: the table lock modes that hold up a CREATE INDEX (its ShareLock; ShareLock: another build in an open transaction)
_BLOCKING = ("RowExclusiveLock", "ShareUpdateExclusiveLock", "ShareLock", "ShareRowExclusiveLock", "ExclusiveLock",
             "AccessExclusiveLock")


class IndexBuildBusyError(VectorDBUnavailableError):
    """Another session held the table a vector index is built on past the wait (a killed run's build still running
    on the server): exit 75, a job failed with the message; a later run keeps that build's index."""

    retry_after = 60


def build_index(conn, create, table: str, wait_s: float) -> None:
    """Run ``create`` (a ``CREATE INDEX IF NOT EXISTS`` on ``table``), waiting at most ``wait_s`` seconds (0: as long
    as it takes; a smaller ``lock_timeout`` of the session is kept) for another session's lock on ``table``: the
    same index's build left running by a killed run (kept once it commits: its name then exists), or a transaction
    writing rows. Past the wait: :class:`IndexBuildBusyError` naming that session's pid."""
    from psycopg import errors as pg_errors

    own = float(conn.execute("SELECT extract(epoch FROM current_setting('lock_timeout')::interval)").fetchone()[0])
    wait = min(w for w in (float(wait_s), own, float("inf")) if w > 0)
    for retry in (False, True):
        try:
            with conn.transaction():
                if wait != own and wait != float("inf"):
                    conn.execute(f"SET LOCAL lock_timeout = '{max(1, int(wait * 1000))}ms'")
                conn.execute(create)
            return
        except pg_errors.UniqueViolation:
            # the other session's build committed while ours waited on its name: kept by the retry's IF NOT EXISTS,
            # which waits for the table as boundedly (a writer may have taken it as that build ended)
            if retry:
                raise
        except pg_errors.LockNotAvailable:
            raise IndexBuildBusyError(_busy(conn, table, wait)) from None


def _busy(conn, table: str, wait: float) -> str:
    """What held ``table`` up, in words: a CREATE INDEX running (its pid and phase), else a lock's holder."""
    regclass = f'"{table}"'  # the caller checked the name (no quote can be in it)
    build = conn.execute("SELECT pid, phase, blocks_done, blocks_total FROM pg_stat_progress_create_index "
                         "WHERE relid = to_regclass(%s) AND pid <> pg_backend_pid() ORDER BY pid LIMIT 1",
                         (regclass,)).fetchone()
    if build is not None:
        pid, phase, done, total = build
        share = f", {100 * done // total}% of its blocks" if total else ""
        return (f"pgvector: another session (pid {pid}) is building an index on {table!r} ({phase}{share}); waited "
                f"{wait:g} s for it (a run killed during its index build leaves its CREATE INDEX running on the "
                "server to its end): try again once it ends (the same migration resumes and keeps that index), or "
                f"stop it with SELECT pg_cancel_backend({pid})")
    held = conn.execute("SELECT l.pid, a.state FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                        "WHERE l.relation = to_regclass(%s) AND l.granted AND l.pid <> pg_backend_pid() "
                        "AND l.mode = ANY(%s) ORDER BY l.pid LIMIT 1", (regclass, list(_BLOCKING))).fetchone()
    if held is None:
        return (f"pgvector: waited {wait:g} s for another session's lock on {table!r} to build its vector index "
                "(that session is gone now): try again")
    pid, state = held
    return (f"pgvector: another session (pid {pid}, {state}) holds {table!r}; waited {wait:g} s for it to build "
            "the vector index (an index build it left uncommitted, or rows it writes): try again once its "
            "transaction ends (the same migration resumes and keeps an index it built)")
