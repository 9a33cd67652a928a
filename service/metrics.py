"""Prometheus metrics of one service instance: one process, or every worker of ``serve --workers N``.

One process (``vecbridge serve``, the tests): each app owns a private
:class:`prometheus_client.CollectorRegistry` (several apps in one test process do not collide), with the
standard ``process_*`` metrics of this process.

Several workers (``vecbridge serve --workers N``, or any server started with ``PROMETHEUS_MULTIPROC_DIR``
set to an empty folder, e.g. ``uvicorn --workers N``): prometheus_client's multiprocess mode. ``serve`` makes
a private temporary folder (mode 0700) for the run, passes it to its workers and removes it when it stops;
every metric update writes the worker's own memory-mapped file there, and a scrape — answered by whichever
worker the connection lands on — reads every worker's files: counters and histograms are the sums over the
workers, dead ones included (never backwards across scrapes, as long as the service runs), gauges are combined
as the table says over the live workers. A worker removes its gauges when it stops; those of a worker that was
killed (OOM) are removed by the next scrape (its pid no longer runs). ``process_*`` then has one series per
live worker, labelled ``pid``: ``sum(process_resident_memory_bytes)`` is the service's resident memory in both
modes.

Label values are bounded: routes are templates (``/v1/maps/{ref}/transform``), never raw paths; maps are names
(not versions: a series per version used, never dropped, grew the scrape with every refit; each answer names
its version; one process forgets the series of a name whose last live version it deleted over HTTP: the series
of names deleted by another process (the CLI, a replica), and every name under ``--workers N`` (prometheus_client's
files cannot forget a key), stay; a scrape never asks the registry, which may be locked); indexes are names on disk
(series of dropped indexes vanish at the next scrape; the gauges of an index dropped and re-created under its name
by another process, e.g. the CLI, leave the scrape until a process loads the new one: the next request that uses
it, or ``/readyz``); encoders are the preloaded ones.

Metrics (workers: how the multiprocess mode combines a gauge)
-------------------------------------------------------------
vecbridge_request_duration_seconds{method, route, status}   histogram (429 / 499 / 5xx are statuses)
vecbridge_requests_in_flight                                 gauge, requests being answered (workers: sum)
vecbridge_batch_rows{route}                                  histogram of rows per request
vecbridge_heavy_requests_running                             gauge, plans / evaluations admitted, at most
                                                             ``max_heavy_requests`` per process (workers: sum)
vecbridge_heavy_requests_refused_total{what}                 counter of plans / evaluations refused (429)
vecbridge_compute_waiting / vecbridge_compute_running        gauges, calls waiting for / running on the heavy
                                                             gate's ``compute_threads`` (workers: sum)
vecbridge_compute_refused_total                              counter of calls refused (429) with
                                                             ``compute_max_waiting`` already waiting for them
vecbridge_lm_requests_waiting                                gauge, LM generate / analyze waiting for the model
                                                             (``limits.lm_max_waiting``; workers: sum)
vecbridge_lm_requests_running                                gauge, LM generate / analyze holding the model's
                                                             turn (0 or 1 per process; workers: sum)
vecbridge_jobs_total{state}                                  counter of jobs reaching a state
vecbridge_jobs_queued / vecbridge_jobs_running               gauges, this process's jobs (workers: sum)
vecbridge_map_use_total{map}                                 counter of map applications, any version
vecbridge_map_rows_total{map}                                counter of rows mapped, any version
vecbridge_index_vectors{index}                               gauge, vectors in the newest generation a process
                                                             holds: set on writes, loads and catch-ups with
                                                             another process's writes (workers: most recent)
vecbridge_index_generation{index}                            gauge, that generation (workers: most recent)
vecbridge_index_logged_deltas{index}                         gauge, deltas logged since its snapshot
vecbridge_index_catchups_total{index, how}                   counter of catch-ups with generations another
                                                             process wrote: ``replay`` (deltas) or ``reload``
vecbridge_index_catchup_seconds_total{index, how}            counter, seconds those catch-ups took
vecbridge_encoder_ready{encoder}                             gauge, 1 once a preloaded encoder answered, 0 while
                                                             pending / loading / failed (workers: min)
vecbridge_indexes_loading                                    gauge, indexes on disk at start-up not loaded (nor
                                                             failed) yet; 0 once /readyz counts none loading
                                                             (workers: sum)
process_resident_memory_bytes, process_cpu_seconds_total,    prometheus_client's process metrics (one process),
process_open_fds, process_start_time_seconds, ...            or one series per live worker labelled ``pid``
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    values,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = ["CONTENT_TYPE_LATEST", "MULTIPROC_ENV", "ServiceMetrics", "multiprocess_dir"]

#: prometheus_client's variable: the folder of the workers' files (read when prometheus_client is imported)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
_LIVE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")
_LIFE = "vecbridge_index_life"
_INDEX_GAUGES = ("vecbridge_index_vectors", "vecbridge_index_generation", "vecbridge_index_logged_deltas")
_MAP_COUNTERS = ("vecbridge_map_use", "vecbridge_map_rows")  # family names (their samples: _total, _created)


def multiprocess_dir() -> str | None:
    """The multiprocess folder when this process records in prometheus_client's multiprocess mode, else None.

    The mode is chosen when prometheus_client is imported (``PROMETHEUS_MULTIPROC_DIR`` set then): a variable
    set later changes nothing, so the value class is what tells."""
    if not getattr(values.ValueClass, "_multiprocess", False):
        return None
    return os.environ.get(MULTIPROC_ENV) or None


class ServiceMetrics:
    """The metric objects of one app: on a private registry, or (multiprocess mode) in this worker's files."""

    def __init__(self) -> None:
        self.multiprocess = multiprocess_dir()
        # multiprocess: the objects still need a registry of their own (names checked once), but a scrape reads
        # the files of every worker instead (see render)
        self.registry = CollectorRegistry(auto_describe=True)
        self._series: dict[tuple, object] = {}  # (metric, label values) -> its series (see series)
        self._forgetting = threading.Lock()  # a series looked up and kept vs. the same one removed (map_dropped)
        r = self.registry
        if self.multiprocess is None:
            ProcessCollector(registry=r)
        #: ``{name: uid}`` of the indexes on disk, set by the app (AppState): a scrape shows the series of those
        #: names alone, and their gauges only where they describe that uid (not a dropped index of the same name)
        self.index_lives: Callable[[], dict[str, str]] | None = None

        def gauge(name, doc, labels=(), mode="livesum"):
            return Gauge(name, doc, list(labels), registry=r, multiprocess_mode=mode)

        self.request_duration = Histogram(
            "vecbridge_request_duration_seconds", "HTTP request latency by route template",
            ["method", "route", "status"], buckets=_LATENCY_BUCKETS, registry=r)
        self.in_flight = gauge("vecbridge_requests_in_flight", "HTTP requests being answered")
        #: the same count for this process alone, as a plain int (read and written on the event loop only): the
        #: fast path runs a large transform inline when its request is the only one (service.api.fastpath)
        self.active = 0
        self.batch_rows = Histogram(
            "vecbridge_batch_rows", "Rows (vectors or texts) per request", ["route"],
            buckets=_BATCH_BUCKETS, registry=r)
        self.heavy_running = gauge("vecbridge_heavy_requests_running",
                                   "Plans and evaluations running (at most max_heavy_requests per process)")
        self.heavy_refused = Counter("vecbridge_heavy_requests_refused_total",
                                     "Plans and evaluations refused with 429 (max_heavy_requests reached)", ["what"],
                                     registry=r)
        self.compute_waiting = gauge("vecbridge_compute_waiting",
                                     "Calls waiting for a turn on the heavy gate's compute_threads")
        self.compute_running = gauge("vecbridge_compute_running", "Calls running on the heavy gate's compute_threads")
        self.compute_refused = Counter("vecbridge_compute_refused_total", "Calls refused with 429 by the heavy gate's "
                                       "compute_threads (compute_max_waiting already waiting)", registry=r)
        self.lm_waiting = gauge("vecbridge_lm_requests_waiting",
                                "LM generate / analyze requests waiting for the model (limits.lm_max_waiting)")
        self.lm_running = gauge("vecbridge_lm_requests_running",
                                "LM generate / analyze requests holding the model's turn (one at a time)")
        self.jobs_total = Counter("vecbridge_jobs_total", "Fit jobs that reached a state", ["state"], registry=r)
        self.jobs_queued = gauge("vecbridge_jobs_queued", "Fit jobs waiting for a worker")
        self.jobs_running = gauge("vecbridge_jobs_running", "Fit jobs running now")
        self.map_use = Counter("vecbridge_map_use_total", "Requests that applied a map (any version)", ["map"],
                               registry=r)
        self.map_rows = Counter("vecbridge_map_rows_total", "Rows mapped (any version)", ["map"], registry=r)
        self.index_vectors = gauge("vecbridge_index_vectors", "Vectors in the newest generation of an index held",
                                   ["index"], "livemostrecent")
        self.index_generation = gauge("vecbridge_index_generation", "Generation of an index held in memory",
                                      ["index"], "livemostrecent")
        self.index_logged = gauge("vecbridge_index_logged_deltas", "Deltas logged since the generation's snapshot",
                                  ["index"], "livemostrecent")
        # which index the three gauges above describe (life_number of its uid): read by a scrape, never shown
        self.index_life = gauge(_LIFE, "Identity of the index the gauges describe", ["index"], "livemostrecent")
        self.index_catchups = Counter("vecbridge_index_catchups_total",
                                      "Catch-ups with a generation another process wrote (replay: deltas; reload)",
                                      ["index", "how"], registry=r)
        self.index_catchup_seconds = Counter("vecbridge_index_catchup_seconds_total",
                                             "Seconds spent catching up with other processes' generations",
                                             ["index", "how"], registry=r)
        self.encoder_ready = gauge("vecbridge_encoder_ready", "1 once a preloaded encoder answered a first embedding",
                                   ["encoder"], "livemin")
        self.indexes_pending = gauge("vecbridge_indexes_loading",
                                     "Indexes on disk at start-up that are not loaded (nor failed) yet")

    # --- what the app reports -------------------------------------------------------------------------------
    def series(self, metric, *values):
        """``metric.labels(*values)`` (as strings), kept for the next request: prometheus_client's lookup cost ~2 µs,
        and every request made three or four of them. For metrics whose series are never removed (requests, batch
        rows) or removed with their entry here (maps, :meth:`map_dropped`); bounded (cleared past 4,096 series)."""
        key = (id(metric), values)
        child = self._series.get(key)
        if child is None:
            with self._forgetting:  # never a removed series kept here: its counts would be lost for good
                if len(self._series) > 4096:
                    self._series.clear()
                child = self._series[key] = metric.labels(*map(str, values))
        return child

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.series(self.request_duration, method, route, status).observe(seconds)

    def observe_rows(self, route: str, rows: int) -> None:
        self.series(self.batch_rows, route).observe(rows)

    def observe_map(self, name: str, rows: int) -> None:
        """A request applied a version of map ``name`` to ``rows`` rows (counted by name alone, see above)."""
        self.series(self.map_use, name).inc()
        self.series(self.map_rows, name).inc(rows)

    def map_dropped(self, name: str) -> None:
        """No version of map ``name`` is live any more: forget its series (one process; the multiprocess files cannot
        forget: a scrape leaves out the series of names without a live version)."""
        if self.multiprocess is not None:
            return
        with self._forgetting:
            for c in (self.map_use, self.map_rows):
                self._series.pop((id(c), (name,)), None)
                with contextlib.suppress(KeyError):  # never counted here (older prometheus_client raises)
                    c.remove(name)

    def index_changed(self, idx) -> None:
        """The index ``idx`` (a :class:`~service.indexes.SpaceIndex`) holds a new generation: written, loaded or
        caught up with (called by the index's writer or loader: only reads its counts)."""
        name = idx.name
        self.index_vectors.labels(name).set(idx.count)
        self.index_generation.labels(name).set(idx.generation)
        self.index_logged.labels(name).set(idx.logged_deltas)
        self.index_life.labels(name).set(life_number(idx.uid))  # last: a scrape in between hides, never mislabels

    def index_caught_up(self, name: str, how: str, seconds: float) -> None:
        """A catch-up with another process's generation of ``name``: ``how`` ``replay`` or ``reload``."""
        self.index_catchups.labels(name, how).inc()
        self.index_catchup_seconds.labels(name, how).inc(seconds)

    def index_dropped(self, name: str) -> None:
        """Forget ``name``'s series (one process; the multiprocess files cannot forget: a scrape leaves out the
        series of names no longer on disk)."""
        if self.multiprocess is not None:
            return
        for g in (self.index_vectors, self.index_generation, self.index_logged, self.index_life):
            try:
                g.remove(name)
            except KeyError:
                pass
        for c in (self.index_catchups, self.index_catchup_seconds):
            for how in ("replay", "reload"):
                try:
                    c.remove(name, how)
                except KeyError:
                    pass

    def indexes_loading(self, n: int) -> None:
        """``n`` indexes of the data dir are still to be loaded at start-up (:meth:`IndexStore.load_in_background`)."""
        self.indexes_pending.set(n)

    def encoder_status(self, name: str, status: str) -> None:
        """A preloaded encoder's status (``pending``, ``loading``, ``ready``, ``failed: ...``)."""
        self.encoder_ready.labels(name).set(1 if status == "ready" else 0)

    # --- scrape and exit ------------------------------------------------------------------------------------
    def render(self) -> bytes:
        """The text exposition format of every metric (multiprocess: of every worker)."""
        scrape = CollectorRegistry()
        scrape.register(_Scrape(self))
        return generate_latest(scrape)

    def close(self) -> None:
        """At the process's exit (multiprocess mode): remove this worker's gauges from the folder."""
        if self.multiprocess is not None:
            _forget(os.getpid(), self.multiprocess)


class _Scrape:
    """What one scrape answers: this app's registry (one process) or every worker's files plus each live worker's
    process metrics (multiprocess); index series only for the names on disk, and index gauges only where they
    describe the index on disk under that name (before, a dropped index's numbers stayed under a re-created one's
    name until a process loaded it)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterable[Metric]:
        m = self.m
        if m.multiprocess is None:
            families = list(m.registry.collect())
        else:
            pids = _live_workers(m.multiprocess)
            families = [*MultiProcessCollector(None, m.multiprocess).collect(), *_process_metrics(pids)]
        lives = m.index_lives() if m.index_lives is not None else None
        held = {s.labels.get("index"): s.value for fam in families if fam.name == _LIFE for s in fam.samples}
        current = None if lives is None else {n for n, uid in lives.items() if held.get(n) == life_number(uid)}
        for fam in families:
            if fam.name == _LIFE:
                continue
            if lives is not None and fam.name.startswith("vecbridge_index_"):
                keep = current if fam.name in _INDEX_GAUGES else lives
                fam.samples = [s for s in fam.samples if s.labels.get("index") in keep]
            yield fam


def life_number(uid: str) -> float:
    """``uid`` (an index's identity) as a gauge value: 52 bits of its hash, exact in a float."""
    return float(int.from_bytes(hashlib.blake2b(uid.encode(), digest_size=8).digest(), "big") >> 12)


def _live_workers(path: str) -> list[int]:
    """The pids of the workers with gauges in ``path``; those of workers no longer running are removed first."""
    pids = set()
    for f in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        hit = _LIVE_FILE.fullmatch(os.path.basename(f))
        if hit:
            pids.add(int(hit.group(1)))
    live = []
    for pid in sorted(pids):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:  # killed without its clean-up (OOM, SIGKILL): its gauges no longer hold
            _forget(pid, path)
            continue
        except PermissionError:  # runs, as another user (a reused pid): keep it
            pass
        live.append(pid)
    return live


def _forget(pid: int, path: str) -> None:
    """Remove the live gauges of worker ``pid`` (prometheus_client's ``mark_process_dead``), where another scrape
    may be removing the same files: prometheus_client's raised FileNotFoundError for a file the other worker removed
    first, and the scrape answered 500 (seen in CI just after a worker was killed, when both workers' scrapes found
    it dead)."""
    for f in glob.glob(os.path.join(path, f"gauge_live*_{pid}.db")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f)


def _process_metrics(pids: list[int]) -> list[Metric]:
    """prometheus_client's process metrics of each of ``pids`` (Linux ``/proc``), labelled ``pid``."""
    out: dict[str, Metric] = {}
    for pid in pids:
        for fam in ProcessCollector(pid=lambda p=pid: p, registry=None).collect():
            merged = out.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type))
            for s in fam.samples:
                merged.add_sample(s.name, {**s.labels, "pid": str(pid)}, s.value)
    return list(out.values())
