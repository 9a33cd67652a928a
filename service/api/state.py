"""What one running app holds: registry, indexes, jobs, metrics, and what references resolve to.

Built in the app's lifespan and reached from routes through ``deps.StateDep``. Loaded maps,
steers and the compositions along a path of maps are cached by the registry itself (keyed by
artifact sha256: immutable, never stale; see :meth:`~service.registry.Registry.compose`), with
room for :data:`MAP_CACHE_SIZE` of them holding at most ``Settings.map_cache_mb`` of arrays. What references resolve to
(``name``, ``name@alias``, a space's path of maps, a space) is cached too, stamped with the
registry's :meth:`~service.registry.Registry.generation`, which every registry write bumps, and the random id
the write stored with it: a request checks that one pair instead of repeating the lookups, and an alias move or a
new version through any worker or replica shows up at the next request — also after the registry was rolled back
(a restored dump, a standby that was behind), where the counter alone comes back to a value it had (QA 4801).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

import anyio
import anyio.to_thread

from align import ClusterMap, LinearMap

from ..config import Settings
from ..encoders import UnknownEncoderError
from ..indexes import IndexStore
from ..indexes.locking import WouldBlock
from ..job_pool import Stop
from ..jobs import JobManager, JobStore
from ..metrics import ServiceMetrics
from ..ops.backup import refuse_pg_backup
from ..ops.indexes import Translation, leads, space_encoder, translation
from ..ops.preload import EncoderPreload
from ..ops.vectordb import SharedStore
from ..registry import Registry, RegistryUnavailableError, VersionInfo, open_registry
from ..spaces import space_references
from .gate import Gate, run_unless_gone

__all__ = ["MAP_CACHE_SIZE", "AppState", "Heavier", "InMemory", "Translation"]

MAP_CACHE_SIZE = 64  # loaded maps / steers / composed paths one app keeps in memory (and map_cache_mb of them)


#: A transform, search or index-write body over this size takes the heavy gate's threads (1 MiB: ~700 rows of
#: 384 float32; a search of that many queries over 40k rows is ~0.3 s of one core).
HEAVY_BODY_BYTES = 1 << 20


class Heavier:
    """What a :meth:`HeavyGate.hop` function returns when it finds, once its small body is parsed, that its work is
    heavy anyway (a search with a large ``k``, ``ef_search``, CSLS, texts): ``fn`` then runs on the gate's threads."""

    __slots__ = ("fn",)

    def __init__(self, fn) -> None:
        self.fn = fn


class HeavyGate:
    """CPU-heavy request work, kept from the thread pool every other route shares.

    :meth:`run` runs a function on ``threads`` threads of its own (more calls wait their turn without holding a
    thread): text embeddings, plans, evaluations; :meth:`hop` sends transforms, searches and index writes there
    when their body is large (index writes from texts whatever their size, searches estimated heavy: a
    :class:`Heavier`). :meth:`slot` admits at most ``n`` of the requests that compute for seconds (plans,
    evaluations) and refuses the rest (429) rather than queueing them: many would fill the pool and keep the
    event loop from the GIL, so every other request, health checks too, would wait behind them. Both are a
    :class:`~service.api.gate.Gate`; at most ``waiting`` calls (``compute_max_waiting``; None: any number) wait for
    the threads, each holding its request's parsed body, and more are refused (429) rather than queued.
    """

    def __init__(self, n: int, threads: int = 2, metrics: ServiceMetrics | None = None,
                 waiting: int | None = None) -> None:
        self.n = int(n)
        self.metrics = m = metrics or ServiceMetrics()  # saturation: waiting / running calls, running and refused slots
        self.slots = Gate(self.n, 0, busy=f"{{what}}: {{running}} such request(s) already running "
                                          f"(max_heavy_requests={self.n}); retry in a few seconds",
                          running_gauge=m.heavy_running, on_refused=lambda what: m.heavy_refused.labels(what).inc())
        self.compute = Gate(int(threads), waiting, waiting_gauge=m.compute_waiting, running_gauge=m.compute_running,
                            busy=f"busy: {{running}} request(s) compute and {{waiting}} wait for the compute threads "
                                 f"(compute_max_waiting={waiting}); retry in a few seconds",
                            on_refused=lambda what: m.compute_refused.inc())
        self.limiter = self.compute.limiter
        self._threads = anyio.CapacityLimiter(int(threads))  # never waits: the turn was taken from ``limiter``

    @property
    def busy(self) -> int:
        """Plans and evaluations running (holding a :meth:`slot`)."""
        return self.slots.running

    async def run(self, fn, request=None):
        """``fn()`` on one of this gate's threads, once it is this call's turn. With the ``request`` whose work it
        is: a client that left before its turn gives the turn up (:class:`ClientDisconnect`, a 499) instead of
        computing for nobody: clients that time out and retry would otherwise multiply the queue. A client that
        leaves while ``fn`` runs stops it at its next checkpoint (:func:`~service.api.gate.run_unless_gone`: between
        batches of texts, at a plan's progress reports), the same 499: three abandoned 20,000-text embeddings
        kept a transform waiting 210 s."""
        async with self.compute.turn(request):
            if request is None:
                return await anyio.to_thread.run_sync(fn, limiter=self._threads)
            return await run_unless_gone(fn, request, self._threads)

    async def hop(self, fn, nbytes: int, request=None):
        """``fn()`` for a request with a body of ``nbytes``: over :data:`HEAVY_BODY_BYTES` (its work grows with
        its rows) on this gate's threads (see :meth:`run`), else on the shared pool. A ``fn`` that returns a
        :class:`Heavier` (a small body asking for heavy work) has its rest run on the gate's threads too."""
        if nbytes > HEAVY_BODY_BYTES:
            return await self.run(lambda: _rest(fn()), request)
        out = await anyio.to_thread.run_sync(fn)
        return await self.run(out.fn, request) if isinstance(out, Heavier) else out

    def slot(self, what: str):
        """``async with gate.slot("plan")``: one of the ``n`` places of requests that compute for seconds, or a
        BusyError (429) at once."""
        return self.slots.turn(what=what)


def _rest(out):
    return out.fn() if isinstance(out, Heavier) else out


class AppState:
    """Long-lived resources of one app instance."""

    def __init__(self, settings: Settings, *, metrics: ServiceMetrics | None = None, stop: Stop | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or ServiceMetrics()
        self.started_at = time.monotonic()  # for uptime_seconds: the wall clock may be set back
        self.registry: Registry | None = None
        self.registry_error: str | None = None
        self.registry_for_good = False  # registry_error is one no retry helps (a password refused): /readyz says so
        self.registry_probe = None  # (future, start time) of /readyz's registry query (routers/ops.py)
        self.artifacts_probe = None  # (future, start time) of /readyz's look at the artifact folder
        self.aliases_probe = None  # the same, of its look at the aliased versions' files
        self.data_dir_probe = None  # (future, start time) of /readyz's look at the folders it writes to
        self.indexes = IndexStore(Path(settings.data_dir) / "indexes", observer=self.metrics)
        self.metrics.index_lives = self.indexes.lives  # a scrape leaves out indexes dropped (re-created) meanwhile
        self.jobs = JobManager(settings.job_workers, settings.max_queued_jobs, metrics=self.metrics,
                               store=JobStore(Path(settings.data_dir) / "jobs.sqlite",
                                              keep_finished=settings.job_history), stop=stop)
        self.demo_job_id: str | None = None
        self.demo_lock = None  # .demo.lock while this process's demo runs and after (service/ops/demo.py)
        self.demo_elsewhere = False  # another process held it at start: demo_status reads its .demo.status
        self.heavy = HeavyGate(settings.max_heavy_requests, settings.compute_threads, self.metrics,
                               waiting=settings.compute_max_waiting)
        self.preload = EncoderPreload(settings.preload_encoders,  # names checked by Settings
                                      on_status=self.metrics.encoder_status)
        self._resolved: dict[tuple, tuple[tuple, object]] = {}  # key -> ((registry generation, its id), value)
        self._seen: tuple[int, tuple] | None = None  # (registry change token, (generation, id)) last read together
        self._loads: dict[str, asyncio.Future] = {}  # index name -> its load for the requests waiting (after_loads)
        self.vectordb = None if not settings.vectordb_url else SharedStore(
            settings.vectordb_url, api_key=settings.vectordb_api_key, ca_file=settings.vectordb_ca_file)
        # one thread for the shared connection's calls: the others wait on the event loop, holding no thread, so a
        # database that hangs cannot take the pool every other route needs
        self.vectordb_turns = anyio.CapacityLimiter(1)

    # --- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Open the data dir's stores and the registry (see :meth:`open_registry`: a registry database that is down
        leaves ``registry`` None, and the app retries)."""
        Path(self.settings.data_dir).mkdir(parents=True, exist_ok=True)
        self.open_registry()
        self.jobs.open()  # jobs of a killed predecessor are reported failed ("interrupted by restart")
        # in the background: the process answers at once; each index loaded sets its gauges (IndexStore's observer)
        self.indexes.load_in_background(on_done=freeze_heap)

    def open_registry(self) -> bool:
        """Open the registry; True once it is open.

        A database server that refuses, drops or does not answer the connection
        (:class:`~service.registry.RegistryUnavailableError`) is recorded in ``registry_error`` and False
        returned: the app serves ``/healthz``, ``/readyz`` says why it is not ready, routes answer 503, and the
        app calls this again until the database is back. Any other failure (a bad URL, tables vecbridge did not
        create) raises: start-up fails.
        """
        refuse_pg_backup(self.settings)  # never a new registry (and the demo) in a backup that needs its database
        try:
            self.registry = open_registry(self.settings.resolved_registry_url(), self.settings.resolved_artifact_dir(),
                                          cache_size=MAP_CACHE_SIZE, **self.settings.registry_options())
        except RegistryUnavailableError as exc:
            self.registry_error = f"{type(exc).__name__}: {exc}"
            self.registry_for_good = exc.retry_after is None
            return False
        except Exception as exc:
            self.registry_error = f"{type(exc).__name__}: {exc}"
            raise
        self.registry_error = None
        return True

    async def after_loads(self, *names: str) -> None:
        """Wait, on the event loop and without a thread, while other threads load ``names`` (every index being
        loaded when none is named); returns at once for one in memory or not being loaded.

        A request for an index the start-up is still loading then takes a pool thread only once it can be served.
        Before, each such request held one of the pool's 40 threads for the whole load (minutes for a large index
        on a slow disk), and 40 of them stalled every other route that needs the pool. One the start-up has not
        reached yet is loaded by one pool thread for all the requests that want it (a burst of them would each
        have taken a thread before the first one's load began).
        """
        loop = asyncio.get_running_loop()
        for name in names or self.indexes.loading():
            done = loop.create_future()

            def wake(done=done):
                try:
                    loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))
                except RuntimeError:  # the loop closed meanwhile (shutdown): nobody waits any more
                    pass

            if self.indexes.when_loaded(name, wake):
                await done
            elif self.indexes.pending(name):
                if name not in self._loads:  # on the event loop: no other request can be between test and set
                    self._loads[name] = asyncio.ensure_future(self._load_once(name))
                await asyncio.shield(self._loads[name])  # a request that leaves does not stop the others' load

    async def _load_once(self, name: str) -> None:
        """Load ``name`` in a pool thread; its outcome is for the requests to find (a failure: their 404)."""
        def load() -> None:
            with suppress(Exception):
                self.indexes.get(name)

        try:
            await anyio.to_thread.run_sync(load)
        finally:
            self._loads.pop(name, None)

    def opened_files(self) -> list:
        """The SQLite files this app's registry and job store opened (:class:`service.storage.OpenedFile`)."""
        return [o.opened for o in (self.registry and self.registry.db, self.jobs.store) if o is not None]

    def close(self) -> None:
        self.indexes.stop_loading()
        self.jobs.shutdown(wait=False)
        if self.demo_lock is not None:
            self.demo_lock.close()
        if self.vectordb is not None:
            self.vectordb.close()
        if self.registry is not None:
            self.registry.close()

    # --- maps -------------------------------------------------------------------------------
    def load_version(self, v: VersionInfo) -> LinearMap | ClusterMap:
        return self.registry.load_map(v)

    def _generation(self) -> tuple[int, str]:
        """The registry's ``(generation, its random id)``; without a query while its change token says nothing was
        committed since."""
        token = self.registry.change_token()
        seen = self._seen
        if token is not None and seen is not None and seen[0] == token:
            return seen[1]
        gen, token = self.registry.generation_token()
        if token is not None:
            self._seen = (token, gen)  # one tuple: threads never pair one read's token with another's generation
        return gen

    def _current(self, key: tuple, lookup):
        """``lookup()``, remembered until the registry's generation changes (errors are not cached)."""
        gen = self._generation()
        hit = self._resolved.get(key)
        if hit is not None and hit[0] == gen:
            return hit[1]
        value = lookup()
        if len(self._resolved) > 4096:
            self._resolved.clear()
        self._resolved[key] = (gen, value)
        return value

    def get_space(self, name: str):
        """``registry.get_space(name)``, cached per registry generation."""
        return self._current(("space", name), lambda: self.registry.get_space(name))

    def resolve(self, ref: str) -> VersionInfo:
        """``registry.resolve(ref)``, cached per registry generation (see the module docstring).

        Version numbers no backend can store are refused by :func:`~service.registry.parse_ref` (422, not 500).
        """
        return self._current(("ref", ref), lambda: self.registry.resolve(ref))

    def space_references(self, dim: int) -> dict:
        """:func:`service.spaces.space_references` of ``dim``-wide spaces, cached per registry generation."""
        return self._current(("references", dim), lambda: space_references(self.registry, dim))

    def resolve_steer(self, ref: str):
        """``(SteerInfo, Steer | MeanShift)`` for ``ref``; artifacts cached by sha256 (immutable), refs resolved per call."""
        info = self.registry.resolve_steer(ref)
        return info, self.registry.load_steer(info)

    def unchanged(self) -> tuple[int, tuple]:
        """``(change token, generation)`` of the last lookups when the registry's change token still reads the same
        (nothing committed since, by any process), else :class:`~service.indexes.locking.WouldBlock`. One ``stat``
        and one ``pread``: safe on the event loop."""
        token = self.registry.change_token()
        seen = self._seen
        if token is None or seen is None or seen[0] != token:
            raise WouldBlock("the registry changed since the last lookup")
        return seen

    def memo(self, key: tuple, seen: tuple[int, tuple] | None = None):
        """What ``key`` resolved to (see :meth:`_current`) when the registry's change token is unchanged since;
        else :class:`~service.indexes.locking.WouldBlock`. No query, no lock wait: safe on the event loop.
        ``seen``: what :meth:`unchanged` answered for this request (read once per request), else read now."""
        seen = seen or self.unchanged()
        hit = self._resolved.get(key)
        if hit is None or hit[0] != seen[1]:
            raise WouldBlock(f"{key[0]} not resolved yet")
        return hit[1]

    def resolve_map_cached(self, ref: str, seen: tuple[int, tuple] | None = None
                           ) -> tuple[VersionInfo, LinearMap | ClusterMap] | None:
        """:meth:`resolve_map` when it needs no I/O at all — the registry's change token is unchanged since
        ``ref`` was resolved and the artifact is in memory — else None. Safe on the event loop. ``seen``: as
        :meth:`memo`'s."""
        try:
            v = self.memo(("ref", ref), seen)
        except WouldBlock:
            return None
        m = self.registry.cached_map(v)
        return None if m is None else (v, m)

    def resolve_map(self, ref: str) -> tuple[VersionInfo, LinearMap | ClusterMap]:
        v = self.resolve(ref)
        return v, self.load_version(v)

    def translation(self, source_space: str, target_space: str, map_ref: str | Sequence[str] | None = None
                    ) -> Translation:
        """The map from ``source_space`` to ``target_space``: ``map_ref`` (a map or a path of them) if given, else
        the registry's path
        (:func:`service.ops.indexes.translation`, with this app's cached lookups).

        Raises NotFoundError when no chain of maps exists, ConflictError-free for the same space.
        """
        return translation(self.registry, source_space, target_space, map_ref, resolve=self.resolve,
                           load=self.load_version,
                           find_path=lambda: self._current(("path", source_space, target_space),
                                                           lambda: self.registry.find_path(
                                                               source_space, target_space, self.settings.path_alias)))

    # --- encoders ---------------------------------------------------------------------------
    def encoder(self, name: str):
        """The installed encoder ``name``: :func:`service.encoders.get_encoder` (one cache per process, the
        CLI's too); UnknownEncoderError (404) naming the installed ones otherwise."""
        try:
            from ..encoders import get_encoder, list_encoders
        except ImportError as exc:  # encoders extra not installed
            raise UnknownEncoderError(f"encoders are not available in this installation: {exc}") from None
        try:
            return get_encoder(name)
        except (KeyError, LookupError, ValueError) as exc:
            try:
                known = ", ".join(sorted(_encoder_names(  # "installed" listed every known one, mpnet too
                    e for e in list_encoders() if not isinstance(e, dict) or e.get("installed", True)))) or "none"
            except Exception:  # noqa: BLE001
                known = "?"
            # get_encoder's own UnknownEncoderError already says "unknown encoder 'x'; known: ...": not twice
            said = str(exc) if isinstance(exc, UnknownEncoderError) else f"unknown encoder {name!r} ({exc})"
            raise UnknownEncoderError(f"{said}; installed: {known}") from None

    def encoder_for_space(self, space: str):
        return space_encoder(self.registry, space, self.encoder)

    def spaces_for_encoder(self, encoder: str) -> tuple[list[str], list[str]]:
        """Names of the registered spaces produced by ``encoder``, in two groups: the spaces named like it
        (``minilm`` for ``all-MiniLM-L6-v2`` too) whose encoder is it or unknown, and the other spaces registered
        with it.

        Encoder names are compared in canonical form (``minilm`` == ``all-MiniLM-L6-v2``); which of several
        spaces a request uses is :func:`service.ops.embeddings.embed`'s choice, never name order.
        """
        want = {encoder, _canonical(encoder)}
        spaces = self.registry.list_spaces()

        def means(name: str | None) -> bool:
            return bool(name) and (name in want or _canonical(name) in want)

        named = [s.name for s in spaces if means(s.name) and (not s.encoder or means(s.encoder))]
        made = [s.name for s in spaces if means(s.encoder)]
        if not named and not made:  # by name first; loading the encoder is the slow way
            want.add(getattr(self.encoder(encoder), "name", encoder))
            made = [s.name for s in spaces if means(s.encoder)]
        return named, [name for name in made if name not in named]


def freeze_heap() -> None:
    """What is loaded now lives as long as the process: move it out of the collector's sight, so a full
    collection no longer walks it (~100k start-up objects: 40-75 ms pauses measured, ~0 after). Called by the
    app's lifespan at start-up and once the indexes are loaded (their payloads)."""
    gc.collect()
    gc.freeze()


def _canonical(name: str) -> str:
    try:
        from ..encoders import canonical_name

        return canonical_name(name)
    except Exception:  # noqa: BLE001 - unknown names compare as given
        return name


def _encoder_names(items) -> list[str]:
    out = []
    for e in items:
        if isinstance(e, str):
            out.append(e)
        elif isinstance(e, dict):
            out.append(str(e.get("name")))
        else:
            out.append(str(getattr(e, "name", e)))
    return out


class InMemory:
    """A search :class:`~service.ops.indexes.Resolver` for the event loop: what ``state`` holds in memory.

    Answers as :class:`AppState` would from its caches (spaces, paths and aliases resolved at the current
    registry generation, maps and compositions already loaded) and raises
    :class:`~service.indexes.locking.WouldBlock` for anything else — a lookup, a load, an encoder, a steer,
    or an error to report (the waiting path then makes the same error the route would).
    """

    def __init__(self, state: AppState) -> None:
        self.state = state
        self._seen: tuple[int, tuple] | None = None  # AppState.unchanged(), read at this request's first lookup

    def _unchanged(self) -> tuple[int, tuple]:
        """The registry checked for changes once per request (one ``stat`` and ``pread`` of its file, not one per
        lookup): the request's lookups then all answer from the same generation."""
        if self._seen is None:
            self._seen = self.state.unchanged()
        return self._seen

    def _memo(self, key: tuple):
        return self.state.memo(key, self._unchanged())

    def get_space(self, name: str):
        return self._memo(("space", name))

    def translation(self, source_space: str, target_space: str, map_ref: str | Sequence[str] | None = None
                    ) -> Translation:
        st = self.state
        if isinstance(map_ref, str):
            hit = st.resolve_map_cached(map_ref, self._unchanged())
            if hit is None or (hit[0].source_space, hit[0].target_space) != (source_space, target_space):
                raise WouldBlock("map not in memory (or not this path: the waiting path reports it)")
            return Translation(hit[1], [hit[0]])
        if map_ref:  # a pinned path: each ref resolved at this generation, and it must lead the way asked
            chain = [self._memo(("ref", ref)) for ref in map_ref]
            if not leads(chain, source_space, target_space):
                raise WouldBlock("not this path: the waiting path reports it")
        else:
            chain = self._memo(("path", source_space, target_space))
        if not chain:
            return Translation(None, chain)
        m = st.registry.cached_compose(chain)
        if m is None:
            raise WouldBlock("path of maps not in memory")
        return Translation(m, chain)

    def space_references(self, dim: int) -> dict:
        return self._memo(("references", dim))

    def resolve_steer(self, ref: str):
        raise WouldBlock("steers are resolved per request")

    def encoder_for_space(self, space: str):
        raise WouldBlock("texts are embedded off the event loop")
