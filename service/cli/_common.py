"""What every command group of ``vecbridge`` shares: the context, output, progress bars, input options.

- :class:`Ctx` — settings and a lazily opened registry (``click`` passes it as ``obj``).
- :func:`emit` — JSON (``--json``) or one text block.
- :func:`progress_bar` — the ``progress(stage, fraction)`` callable of the operations, drawn with tqdm.
- option stacks: :func:`input_opts` (a source/target pair of files), :func:`store_opts` (a vector
  database), :func:`register_opts` (random state, alias, description, json, quiet), :data:`json_opt`,
  :data:`quiet_opt`, :data:`description_opt`, :data:`random_state_opt`.
- small file readers the options name: :func:`read_pair`, :func:`read_seed_pairs`, :func:`read_labels`,
  :func:`read_ids`.
"""

from __future__ import annotations

import json
import math
import re
import sys
import warnings
from pathlib import Path

import click
import numpy as np
from tqdm import tqdm

from align.exceptions import InputError, PairCountError

from ..config import load_settings
from ..encoders import space_encoder
from ..io import (
    check_file,
    count_rows,
    is_text_path,
    load_npy,
    parse_rows,
    read_vectors,
    resolve_rows,
)
from ..limits import MAX_SEED
from ..registry import NotFoundError, open_registry
from ..registry.errors import InvalidNameError
from ..registry.names import parse_version, utf8_safe
from . import check_stop, stop_kept

__all__ = ["Ctx", "alias_command", "echo_record", "emit_summaries", "versions_summary", "emit", "version_record",
           "progress_bar", "stderr_is_terminal", "option_given", "parse_kv", "registry_option", "FiniteRange",
           "file_rows_opts", "input_opts", "read_pair", "read_seed_pairs", "read_labels", "read_ids", "store_opts",
           "json_opt",
           "quiet_opt", "description_opt", "random_state_opt", "register_opts", "VERSION", "registry_exists", "warn",
           "warn_aliases_left",
           "ROWS", "RowIndices", "rows_record"]


class Ctx:
    """Settings (group options over the environment) and the registry, opened on first use."""

    def __init__(self, data_dir: Path | None, registry_url: str | None, artifact_dir: Path | None = None):
        kw = {k: v for k, v in (("data_dir", data_dir), ("artifact_dir", artifact_dir)) if v is not None}
        if registry_url is not None:  # a bad one named VECBRIDGE_REGISTRY_URL, which may not even be set
            kw["registry_url"] = registry_option(registry_url)
        self.settings = load_settings(**kw)  # a bad VECBRIDGE_* variable: ConfigError, one line and exit 2
        self._reg = None
        self.lm = None  # the language model, loaded on first use (service.ops.lm.get_lm)

    def store_url(self, store: str | None) -> str:
        """``--store``, else the ``vectordb_url`` setting (the vector database beside the service)."""
        url = store or self.settings.vectordb_url
        if not url:
            raise InputError("give --store URL, or set VECBRIDGE_VECTORDB_URL (the vector database to use)")
        return url

    def store_auth(self) -> dict:
        """``api_key`` / ``ca_file`` of a secured vector database (settings ``vectordb_api_key`` / ``_ca_file``)."""
        return {"api_key": self.settings.vectordb_api_key, "ca_file": self.settings.vectordb_ca_file}

    @property
    def registry(self):
        """The registry, opened on first use. Only a command of :data:`CREATES_REGISTRY` makes a new SQLite registry
        (and its data dir) where there is none. A list command there lists an empty registry and says on stderr that
        there is none (nothing is created); any other command is an error: a mistyped ``--data-dir`` no longer leaves
        an empty registry behind, or answers "no such map" about the wrong place."""
        if self._reg is None:
            s = self.settings
            url, artifacts = s.resolved_registry_url(), s.resolved_artifact_dir()
            missing = _missing_sqlite(url)
            if missing is not None:  # a backup of a PostgreSQL-registry data dir: never a new registry in it
                from ..ops.backup import refuse_pg_backup

                refuse_pg_backup(s)
            command = _command_path()
            if missing is not None and command in LISTS_EMPTY_WITHOUT_REGISTRY:
                if not click.get_current_context().params.get("as_json"):  # --json: the JSON is the whole output
                    click.echo(f"vecbridge: no registry at {missing} yet (data dir {s.data_dir})", err=True)
                url, artifacts = _empty_registry()
            elif missing is not None and command not in CREATES_REGISTRY:
                raise NotFoundError(f"no registry at {missing} (data dir {s.data_dir}): check --data-dir / "
                                    "VECBRIDGE_DATA_DIR (or --registry-url); `vecbridge fit` or `vecbridge spaces add` "
                                    "creates one")
            else:
                s.data_dir.mkdir(parents=True, exist_ok=True)
            self._reg = open_registry(url, artifacts, **s.registry_options())
        return self._reg


#: the commands that may create a registry where there is none (every other command needs one to exist); `embed`
#: opens one only for --space, which registers the space as `spaces add` does
CREATES_REGISTRY = frozenset({"fit", "spaces add", "registry import", "steer fit", "lm steer-fit", "embed"})


#: the list commands, which list nothing (exit 0) where there is no registry
LISTS_EMPTY_WITHOUT_REGISTRY = frozenset({"registry list", "steer list", "spaces"})


def _empty_registry() -> tuple[str, Path]:
    """``(url, artifact dir)`` of an empty registry in a temporary folder, removed when the command ends."""
    import tempfile

    tmp = Path(click.get_current_context().with_resource(tempfile.TemporaryDirectory(prefix="vecbridge-empty-")))
    return f"sqlite:///{tmp / 'registry.sqlite'}", tmp / "artifacts"


def _command_path() -> str:
    """The running command below ``vecbridge``, e.g. ``"registry list"`` ("" outside a click command)."""
    ctx = click.get_current_context(silent=True)
    return " ".join(ctx.command_path.split()[1:]) if ctx is not None else ""


def registry_exists(settings) -> bool:
    """Whether the settings' registry is there to read (a SQLite file that exists, or a server URL)."""
    return _missing_sqlite(settings.resolved_registry_url()) is None


def warn(message: str) -> None:
    """One ``vecbridge: warning:`` line on stderr."""
    click.echo(f"vecbridge: warning: {message}", err=True)


def exit_flagged(message: str, accept: str = "accept") -> None:
    """End a command whose result (printed) is flagged unreliable: ``message`` on stderr and exit 1, the way to
    ``accept`` it named; a stop kept since the commit (:func:`~service.cli.stop_kept`) exits 130 / 143 / 129
    instead, so the line does not promise an exit 1 that does not come."""
    code = "" if stop_kept() else "exit 1 "
    click.echo(f"vecbridge: {message}; {code}(--allow-unreliable to {accept})", err=True)
    sys.exit(1)


def warn_aliases_left(group: str, name: str, version: int, aliases, now: str) -> None:
    """After deleting ``name:version`` of ``vecbridge <group>`` (registry: maps, steer: steers): its aliases stay on
    the deleted version (lineage), so say that ``name@alias`` no longer resolves, what a bare name means ``now``, and
    how to move them."""
    noun = "steer " if group == "steer" else ""
    warn(f"alias(es) {', '.join(aliases)} still point at {noun}{name}:{version}, so "
         f"{', '.join(f'{name}@{a}' for a in aliases)} no longer resolve and {now}; move them with "
         f"`vecbridge {group} alias {name} ALIAS VERSION`")


def _missing_sqlite(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` registry URL when it does not exist; None otherwise (a server URL)."""
    from ..registry.db import sqlite_path

    path = sqlite_path(url)
    return path if path is not None and not path.exists() else None


def registry_option(url: str) -> str:
    """A ``--registry-url`` value, checked as the setting is: a ConfigError (one line, exit 2) naming the option,
    never the URL's password."""
    from ..config import ConfigError, check_registry_url

    try:
        return check_registry_url(url)
    except ValueError as exc:
        raise ConfigError(f"--registry-url: {exc}") from None


def emit(obj, as_json: bool, text: str | None = None) -> None:
    """Print ``obj`` as indented JSON with ``--json`` (NaN and infinities as null: valid JSON), else ``text``
    (nothing when None)."""
    if as_json:
        from ..io import json_finite

        click.echo(json.dumps(json_finite(obj), indent=2, sort_keys=True, default=str, allow_nan=False))
    elif text is not None:
        click.echo(text)


def version_record(reg, v) -> dict:
    """A map version as printed: its record plus ``report_file`` (None without one) and ``artifact_file`` (both None
    once ``registry gc`` collected the version: they named files it removed)."""
    d = v.to_dict()
    report = None if v.collected_at else reg.report_file(v)
    d["report_file"] = str(report) if report else None
    d["artifact_file"] = None if v.collected_at else str(reg.artifact_file(v))
    return d


def ray_logs(quiet: bool):
    """A context in which a Ray session the command starts keeps its console lines ("Started a local Ray
    instance", warnings) to errors when the command is ``quiet`` (``--quiet`` / ``--json``)."""
    import contextlib
    import logging

    if not quiet:
        return contextlib.nullcontext()
    from ..distributed import ray_log_level

    return ray_log_level(logging.ERROR)


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal: the only place a progress bar is drawn. Into a pipe or a file (a cron or CI
    log, ``2>&1 | cat > fit.log``) its ``\\r`` redraws and block characters went as they were, the result line glued
    to the last bar. False without a stderr (started with it closed, ``2>&-``) or one that cannot say."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def progress_bar(*, quiet: bool, as_json: bool):
    """``(progress, close)``: ``progress(stage, fraction)`` draws one tqdm bar per stage on stderr; nothing with
    ``--quiet`` or ``--json`` (a JSON result is the whole output: nothing around it on either stream), nor when stderr
    is not a terminal (:func:`stderr_is_terminal`; closed, ``2>&-``: tqdm failed on ``file=None``)."""
    # either way, every report is a point where a SIGTERM whose first raise was lost stops
    if quiet or as_json or not stderr_is_terminal():
        return (lambda stage, frac: check_stop(stage)), (lambda: None)
    state = {"stage": None, "bar": None}

    def progress(stage: str, frac: float) -> None:
        check_stop(stage)
        if stage != state["stage"]:
            if state["bar"] is not None:
                state["bar"].close()
            state["stage"] = stage
            state["bar"] = tqdm(total=100, desc=stage[:40].ljust(24), file=sys.stderr, leave=False,
                                bar_format="{desc} {bar} {percentage:3.0f}% {elapsed}")
        bar, n = state["bar"], int(round(100 * min(max(frac, 0.0), 1.0)))
        if n != bar.n:  # redrawn on every chunk, a 4,000-chunk transform wrote 231 KB to stderr and ran 2x slower
            bar.n = n
            bar.refresh()

    def close():
        if state["bar"] is not None:
            state["bar"].close()

    return progress, close


def versions_summary(s: dict, resolved: str) -> str:
    """``latest N  versions LIVE/ALL[  aliases A->V ...]  RESOLVED N[  UNRELIABLE a,b]`` of a registry summary
    (``list_maps``: ``resolved`` "path", its ``path_version``; ``list_steers``: "bare", its ``bare_version``) and
    its live versions flagged unreliable (`steer list` said neither: a flagged refit looked like any other)."""
    gone = set(s.get("aliases_on_deleted", ()))  # an alias left on a deleted version no longer resolves: say so
    al = " ".join(f"{k}->{v}{'(deleted)' if k in gone else ''}" for k, v in s["aliases"].items())
    bad = ",".join(str(x) for x in s.get("unreliable_versions") or [])
    return (f"latest {s['latest_version'] or '-'}  versions {s['n_live_versions']}/{s['n_versions']}"
            f"{'  aliases ' + al if al else ''}  {resolved} {s.get(resolved + '_version') or '-'}"
            f"{'  UNRELIABLE ' + bad if bad else ''}")


def emit_summaries(items: list[dict], as_json: bool, *, key: str, versions, line, extra: dict | None = None) -> None:
    """``registry list`` / ``steer list``: with ``as_json`` ``{key: items, **extra}``, each item with its
    ``versions`` (``versions(name)`` as dicts); else one ``line(item)`` per item, or ``(no KEY)``."""
    if as_json:
        for it in items:
            it["versions"] = [v.to_dict() for v in versions(it["name"])]
        emit({key: items, **(extra or {})}, True)
        return
    click.echo("\n".join(line(it) for it in items) if items else f"(no {key})")


def echo_record(d: dict, skip=()) -> None:
    """One line per field of a record (``registry show``, ``steer show``): ``KEY  VALUE``, dicts and lists as JSON."""
    from ..io import json_finite

    for k, val in d.items():
        if k not in skip:
            shown = (json.dumps(utf8_safe(json_finite(val)), sort_keys=True, default=str, allow_nan=False,
                                ensure_ascii=False)  # NaN: null; a tag or path in 中文 as written, not \u4e2d\u6587
                     if isinstance(val, (dict, list)) else val)
            click.echo(f"{k:16} {shown}")


def search_on(name: str, *, source: str = "--search-device", warm: bool = True) -> str:
    """Search flat indexes on device ``name`` in this process (:func:`service.indexes.device.use_device`); a bad
    name or a GPU this machine lacks is a ConfigError (one line, exit 2) that names ``source``."""
    from ..config import ConfigError
    from ..indexes.device import use_device

    try:
        return use_device(name, warm=warm)  # checks the name (ValueError) before anything else
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"{source}: {exc}") from None


def option_given(name: str) -> bool:
    """Whether the running command's option ``name`` came from the command line (or the environment), not its
    default."""
    from click.core import ParameterSource

    source = click.get_current_context().get_parameter_source(name)
    return source not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def parse_kv(items, what="parameter", *, raw: bool = False) -> dict:
    """``("KEY=VALUE", ...)`` -> dict; values are JSON when they parse, else strings (``raw``: always the text as
    typed, as tags keep it: `--tag f=1.50` was stored as "1.5", `--tag flag=true` as "True"). A KEY given twice is a
    usage error (the last value was kept without a word: `--steer plant:1=1 --steer plant:1=-1` searched with -1)."""
    out = {}
    for item in items or ():
        if "=" not in item:
            raise click.UsageError(f"{what} {item!r} must look like KEY=VALUE")
        k, v = item.split("=", 1)
        if k in out:
            raise click.UsageError(f"{what} {k!r} is given twice; give each once")
        try:
            out[k] = v if raw else json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
        except RecursionError:
            raise click.UsageError(f"{what} {k}: the value is nested too deep") from None
    return out


def check_text_encoder(registry, path: str, space: str, encoder: str | None) -> str | None:
    """Before any text is embedded: a text input's ``encoder`` must be the model of ``space`` when that space is
    registered with one (InputError otherwise: :func:`service.encoders.space_encoder`). Returns the encoder to
    use: the one given, else the space's (as HTTP fits, transform and index do; fit and eval asked for one)."""
    if not is_text_path(path):
        return encoder
    try:
        info = registry.get_space(space)
    except NotFoundError:
        return encoder
    return space_encoder(space, info.encoder, encoder)


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` that refuses NaN and infinity: a NaN passes every bound, so `registry gc --wait nan` was
    accepted and waited forever."""

    def convert(self, value, param, ctx):
        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return out


class _Version(click.ParamType):
    """A version number (``low`` .. 2**31-1) in ASCII digits, read by the registry's one strict parser
    (:func:`service.registry.names.parse_version`): ``type=int`` took '1_0' as 10 and '２' (fullwidth) as 2, so
    ``registry delete m 1_0`` deleted m:10."""

    name = "version"

    def __init__(self, low: int = 1):
        self.low = low

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_version(value, repr(value[:40]), low=self.low)
        except InvalidNameError as exc:
            self.fail(str(exc), param, ctx)


#: the type of every VERSION argument
VERSION = _Version()


class RowIndices(np.ndarray):
    """Row indices read from the file ``source`` (``--rows rows.npy``): an int64 array the readers of
    :mod:`service.io` take as rows; ``source`` names it in a fit's recorded inputs."""

    source = ""


class _Rows(click.ParamType):
    """Every ``--rows`` / ``--*-rows``: ``START:STOP`` (kept as written), or a file of row indices: the .npy that
    ``plan --rows-out`` writes (.json or one index per line too): a non-empty 1-d list of integers, none negative
    and none repeated (a repeated row would count one pair twice in a fit; a plan's rows never repeat), each one of
    the file's rows (checked as the file is read). Rows are read in the order listed."""

    name = "rows"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, np.ndarray):
            return value
        if ":" in value and not Path(value).is_file():
            try:
                parse_rows(value)
            except InputError as exc:
                self.fail(str(exc), param, ctx)
            return value
        try:
            p, arr = _read_ints(value, "row indices", 1)
        except InputError as exc:  # FormatError (no such file) included
            self.fail(f"neither START:STOP nor a file of row indices: {exc}", param, ctx)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            self.fail(f"{p.name}: row indices must be a 1-d list of integers, got shape {arr.shape} dtype "
                      f"{arr.dtype}", param, ctx)
        if arr.min() < 0:
            self.fail(f"{p.name}: row index {int(arr.min())} is negative (indices count the file's rows from 0)",
                      param, ctx)
        if arr.dtype.kind == "u" and arr.max() > np.iinfo(np.int64).max:  # it wrapped to a negative index
            self.fail(f"{p.name}: row index {int(arr.max())} is past the rows of any file (at most 2**63 - 1)",
                      param, ctx)
        uniq, counts = np.unique(arr, return_counts=True)
        if (counts > 1).any():
            self.fail(f"{p.name}: row {int(uniq[counts > 1][0])} is listed more than once; list each row once",
                      param, ctx)
        out = arr.astype(np.int64).view(RowIndices)
        out.source = str(p.resolve())
        return out


#: the type of every ``--rows`` option: START:STOP or a file of row indices
ROWS = _Rows()


def rows_record(rows):
    """``rows`` as a fit records it: START:STOP as written, a rows file as ``PATH (N rows, sha256 HEX)``: the hash of
    its indices (int64, in the order listed), so a rows file overwritten after the fit is told from the one used."""
    if not isinstance(rows, np.ndarray):
        return rows
    import hashlib

    digest = hashlib.sha256(np.ascontiguousarray(rows, dtype=np.int64).tobytes()).hexdigest()
    return f"{rows.source or 'a rows file'} ({rows.size} rows, sha256 {digest})"


def _stack(*opts):
    """One decorator applying ``opts`` in the order written (top option first in ``--help``)."""
    def deco(fn):
        for o in reversed(opts):
            fn = o(fn)
        return fn

    return deco


json_opt = click.option("--json", "as_json", is_flag=True, help="Print a machine-readable result.")
quiet_opt = click.option("--quiet", is_flag=True, help="No progress bars.")
description_opt = click.option("--description", default="")
random_state_opt = click.option("--random-state", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
                                help="Seed of every random step.")
#: the tail of every command that fits and registers a steer
register_opts = _stack(
    random_state_opt, click.option("--alias", default=None, help="Point this alias at the new version."),
    description_opt, json_opt, quiet_opt)

#: the rows of one input file INP read in chunks (``vecbridge transform``, ``vecbridge steer apply``)
file_rows_opts = _stack(
    click.option("--rows", type=ROWS, default=None,
                 help="START:STOP rows of INP (negative counts from the end), or a file of row indices (the .npy "
                      "`plan --rows-out` writes; .json or text): those rows, in that order."),
    click.option("--key", default=None, help=".npz array name of INP (needed when it holds several arrays of rows)."),
    click.option("--column", default=None,
                 help="Parquet list column of INP (default: the first list of floats, else of numbers)."),
)

input_opts = _stack(
    click.option("--source", "source", required=True, type=click.Path(dir_okay=False), help="Source vectors or texts."),
    click.option("--target", "target", required=True, type=click.Path(dir_okay=False), help="Target vectors or texts."),
    click.option("--rows", type=ROWS, default=None,
                 help="START:STOP rows of both inputs (unless overridden), or a file of row indices (the .npy "
                      "`plan --rows-out` writes; .json or text): those rows, in that order."),
    click.option("--source-rows", type=ROWS, default=None, help="START:STOP rows of the source, or a rows file."),
    click.option("--target-rows", type=ROWS, default=None, help="START:STOP rows of the target, or a rows file."),
    click.option("--source-key", default=None, help=".npz array name of the source."),
    click.option("--target-key", default=None, help=".npz array name of the target."),
    click.option("--source-column", default=None, help="Parquet list column of the source."),
    click.option("--target-column", default=None, help="Parquet list column of the target."),
    click.option("--source-encoder", default=None, help="Encoder for a text source (see `vecbridge encoders`)."),
    click.option("--target-encoder", default=None, help="Encoder for a text target."),
    click.option("--text-field", default="text", show_default=True, help="JSONL field holding the text."),
)

store_opts = _stack(
    click.option("--store", default=None, metavar="URL",
                 help="milvus://host:port, milvus+https://[user:password@]host:port, milvus:///file.db, "
                      "postgresql://..., qdrant://host:port, qdrant+https://host:port or qdrant:///local/dir "
                      "[env VECBRIDGE_VECTORDB_URL; a secured server's key: VECBRIDGE_VECTORDB_API_KEY, its CA: "
                      "VECBRIDGE_VECTORDB_CA_FILE]."),
    *(click.option(f"--{f}-field", default=None, help=f"Name of the {f} field (default: {default}).")
      for f, default in (("id", "id"), ("vector", "vector (Milvus) / embedding (PostgreSQL)"), ("text", "text"))),
)


def read_pair(o: dict, progress, stream=None):
    """``(X, Y, inputs)`` from the :func:`input_opts` values; ``inputs`` records paths, rows, encoders, shapes.
    ``stream``: these inputs' :class:`~service.ops.fit_stream.PairFiles`, whose memory maps are X and Y (unread)."""
    src_rows = o["rows"] if o["source_rows"] is None else o["source_rows"]  # no `or`: row indices are an array
    tgt_rows = o["rows"] if o["target_rows"] is None else o["target_rows"]
    X = stream.X if stream else read_vectors(
        o["source"], rows=src_rows, key=o["source_key"], column=o["source_column"], encoder=o["source_encoder"],
        text_field=o["text_field"], encoder_option="--source-encoder", key_option="--source-key",
        progress=lambda f: progress("embed source", f))
    Y = stream.Y if stream else read_vectors(
        o["target"], rows=tgt_rows, key=o["target_key"], column=o["target_column"], encoder=o["target_encoder"],
        text_field=o["text_field"], encoder_option="--target-encoder", key_option="--target-key",
        progress=lambda f: progress("embed target", f))
    inputs = {"source": {"path": str(Path(o["source"]).resolve()), "rows": rows_record(src_rows),
                         "encoder": o["source_encoder"], "shape": list(X.shape)},
              "target": {"path": str(Path(o["target"]).resolve()), "rows": rows_record(tgt_rows),
                         "encoder": o["target_encoder"], "shape": list(Y.shape)}}
    return X, Y, inputs


def _holds_bool(obj) -> bool:
    """Whether a parsed JSON value holds ``true`` / ``false`` anywhere (no recursion: nesting is the caller's)."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, bool):
            return True
        if isinstance(x, list):
            stack.extend(x)
    return False


def _read_ints(path: str, what: str, ndmin: int) -> tuple[Path, np.ndarray]:
    """``(path, array)`` of an integer file: ``.npy``, ``.json`` (nested lists), or whitespace-separated text (a UTF-8
    byte order mark first is skipped, as text inputs skip it)."""
    p = Path(path)
    check_file(p)
    suffix = p.suffix.lower()  # seeds.NPY was parsed as text
    try:
        if suffix == ".npy":
            arr = np.asarray(load_npy(p))
        elif suffix == ".json":
            obj = json.loads(p.read_text(encoding="utf-8-sig"))
            if _holds_bool(obj):  # np.asarray([0, true]) is [0, 1]: `true` read as id 1
                raise InputError(f"{p.name}: {what} must be integers, not true / false")
            arr = np.asarray(obj)
        elif ndmin == 1:  # a flat list in any layout: "5 6 7\n8 9" was "the number of columns changed from 3 to 2"
            words = p.read_text(encoding="utf-8-sig").split()
            bad = next((w for w in words if not re.fullmatch(r"[+-]?[0-9]+", w)), None)
            if bad is not None:  # int() reads "1_0" as 10 and would take it
                raise ValueError(f"{bad[:40]!r} is not an integer")
            arr = np.array([int(w) for w in words], dtype=np.int64)
        else:
            with warnings.catch_warnings():  # "input contained no data" on stderr beside the error below
                warnings.simplefilter("ignore", UserWarning)
                arr = np.loadtxt(p, dtype=np.int64, ndmin=ndmin, delimiter=None, encoding="utf-8-sig")
    except (ValueError, OverflowError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: deep JSON
        raise InputError(f"{p.name}: cannot read {what} ({exc})") from None
    if arr.size == 0:  # `[]` read as float64 was "must be integers, got shape (0,) dtype float64"
        raise InputError(f"{p.name}: holds no {what}")
    return p, arr


def read_seed_pairs(path: str):
    """Seed pairs file: ``.npy`` (k, 2) int, ``.json`` [[i, j], ...], or text lines ``i j``."""
    p, arr = _read_ints(path, "seed pairs", 2)
    if arr.ndim != 2 or arr.shape[1] != 2 or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{p.name}: seed pairs must be integer rows 'i_src i_tgt' (k, 2), got shape {arr.shape}")
    return arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)


def read_relevant(path: str, n: int, *, queries: str | None = None, rows: str | None = None) -> np.ndarray:
    """Relevant-document file of labelled queries: ``.npy`` (n,) ints, ``.json`` [i, ...], or one row index per line.
    ``rows`` (START:STOP) of the file ``queries`` selected the ``n`` queries: a file with one row per query of the
    whole queries file is sliced as they were (one with a row per selected query is taken as it is)."""
    p, rel = _read_ints(path, "relevant rows", 1)
    if rel.ndim != 1 or rel.dtype == np.bool_ or not np.issubdtype(rel.dtype, np.integer):
        raise InputError(f"{p.name}: relevant rows must be one integer per query, got shape {rel.shape} "
                         f"dtype {rel.dtype}")
    if rows is not None and queries is not None and rel.shape[0] != n:
        total = count_rows(queries, key_option=None)
        if rel.shape[0] == total:
            rel = rel[resolve_rows(parse_rows(rows), total, queries)]
        else:
            raise PairCountError(f"{p.name} has {rel.shape[0]} relevant rows for {n} queries (rows "
                                 f"{rows_record(rows)} of {Path(queries).name}; or give one per row of that file, "
                                 f"{total})")
    if rel.shape[0] != n:
        raise PairCountError(f"{p.name} has {rel.shape[0]} relevant rows for {n} queries")
    return rel.astype(np.int64)


def read_ids(path: str) -> np.ndarray:
    """Ids file: ``.npy`` (n,) ints, ``.json`` [i, ...], or whitespace-separated integers: int64 (n,)."""
    p, ids = _read_ints(path, "ids", 1)
    if ids.ndim != 1 or ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"{p.name}: ids must be a flat list of integers, got shape {ids.shape} dtype {ids.dtype}")
    return ids.astype(np.int64)


def read_labels(path: str, n: int) -> np.ndarray:
    """Labels file: ``.npy`` (any case) (n,) ints, or text with one of -1 / 0 / +1 per line (a UTF-8 byte order
    mark first is skipped)."""
    p = Path(path)
    check_file(p)
    try:
        y = np.asarray(load_npy(p)) if p.suffix.lower() == ".npy" else \
            np.loadtxt(p, dtype=np.float64, ndmin=1, encoding="utf-8-sig")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{p.name}: cannot read labels ({exc})") from None
    y = np.asarray(y).reshape(-1)
    if not np.issubdtype(y.dtype, np.number) or not np.all(np.isin(y, (-1, 0, 1))):
        raise InputError(f"{p.name}: labels must be -1, 0 or +1")
    if y.shape[0] != n:
        raise PairCountError(f"{p.name} has {y.shape[0]} labels for {n} rows")
    return y.astype(np.int64)


def alias_command(group, help_text: str, set_alias, delete_alias) -> None:
    """Register ``GROUP alias NAME ALIAS [VERSION] [--delete] [--expect N]`` on ``group``: ``set_alias(registry, name,
    alias, version, expected=...)`` or ``delete_alias(registry, name, alias, expected=...)`` (one command shape for
    maps and steers; ``--expect`` guards a removal as it guards a move, as ``If-Match`` does over HTTP; a VERSION
    given with ``--delete`` is that guard: it was ignored, and the alias removed wherever it pointed). ``NAME@ALIAS
    [VERSION]`` is the same command: the help says "Point NAME@ALIAS at VERSION", and ``alias m@prod 3`` answered
    "give a VERSION" (3 was taken for the ALIAS)."""

    @group.command("alias", help=f"{help_text} `alias NAME ALIAS VERSION` and `alias NAME@ALIAS VERSION` are the same.")
    @click.argument("name")
    @click.argument("alias", required=False, metavar="ALIAS")
    @click.argument("version", type=VERSION, required=False)
    @click.option("--delete", is_flag=True, help="Remove the alias instead.")
    @click.option("--expect", "expected", type=_Version(low=0), default=None,
                  help="Compare-and-set: move (or --delete) only while the alias points at this version (0: move only "
                       "while it is not set); else exit 2 saying where it points.")
    @click.pass_obj
    def alias_cmd(obj: Ctx, name, alias, version, delete, expected):
        if "@" in name:  # NAME@ALIAS [VERSION]: the second word is the version
            if version is not None:
                raise click.UsageError(f"{name} names the alias already: give `{name} {version}` (or NAME ALIAS "
                                       "VERSION)")
            ctx = click.get_current_context()
            param = next(p for p in ctx.command.params if p.name == "version")
            name, alias, version = *name.split("@", 1), (None if alias is None else VERSION.convert(alias, param, ctx))
        if alias is None:
            raise click.UsageError("give the ALIAS: NAME ALIAS VERSION or NAME@ALIAS VERSION (or --delete)")
        if delete:
            if version is not None and expected is not None and expected != version:
                raise click.UsageError(f"--delete with VERSION {version} and --expect {expected}: give one of them")
            expected = version if version is not None else expected
            if expected == 0:
                raise click.UsageError("--delete --expect 0 removes nothing (0 means: not set); give the version "
                                       "the alias must point at")
            delete_alias(obj.registry, name, alias, expected=expected)
            click.echo(f"deleted alias {name}@{alias}")
            return
        if version is None:
            raise click.UsageError("give a VERSION (or --delete)")
        set_alias(obj.registry, name, alias, version, expected=expected)
        click.echo(f"{name}@{alias} -> {version}")
