"""``vecbridge lm steer-fit | generate | analyze``: LM-Steer on the causal language model.

Each command parses its options and calls one operation of :mod:`service.ops.lm` with a loader of
the LM (``service.cli.LM_PROVIDER`` when set, else SmolLM2 from its wheel), so an unknown steer or
bad labels exit 2 before the slow model load.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path

import click

from align.exceptions import InputError

from ..io import read_texts
from ..limits import MAX_NEW_TOKENS
from ..lm.model import load_bars_hidden
from ..ops import lm as ops
from ._common import (Ctx, FiniteRange, emit, json_opt, progress_bar, random_state_opt, read_labels, register_opts,
                      stderr_is_terminal)

__all__ = ["lm"]


@click.group()
def lm():
    """LM-Steer on the causal language model (SmolLM2 from its wheel): fit, generate, analyze."""


def _lm_of(obj: Ctx, *, bars: bool = True):
    """The loader of the context's LM (``service.cli.LM_PROVIDER`` read when it is called); ``bars`` False: without
    transformers' load bars on stderr (:func:`~service.lm.model.load_bars_hidden`), as the CLI draws none of its own
    with ``--quiet`` or ``--json`` or when stderr is not a terminal (:func:`~._common.progress_bar`)."""
    from . import LM_PROVIDER  # the package attribute, so that tests can replace it

    def load():
        with nullcontext() if bars else load_bars_hidden():
            return ops.get_lm(obj, LM_PROVIDER)
    return load


def _bars(*, quiet: bool = False, as_json: bool = False) -> bool:
    """Whether a command draws progress bars, its own and the model load's: as :func:`~._common.progress_bar`."""
    return not (quiet or as_json or not stderr_is_terminal())


def _steer_eps(items) -> dict:
    """``("REF=EPS", ...)`` -> ``{REF: EPS}``; InputError for a missing ``=``, a non-finite EPS or a REF given twice."""
    out = {}
    for it in items:
        ref, sep, eps = it.rpartition("=")
        try:
            value = float(eps)
        except ValueError:
            value = math.nan
        if not sep or not ref or not math.isfinite(value):
            raise InputError(f"--steer wants REF=EPS with a finite EPS, got {it!r}")
        if ref in out:  # the last value was kept without a word
            raise InputError(f"--steer {ref} is given twice; give each steer once")
        out[ref] = value
    return out


@lm.command("steer-fit")
@click.option("--texts", required=True, type=click.Path(dir_okay=False), help="Texts (.txt one per line, .jsonl).")
@click.option("--labels", required=True, type=click.Path(dir_okay=False),
              help=".npy or .txt: +1 / -1 / 0 per text: +1 the wanted style, -1 its opposite (the steer learns their "
                   "difference: eps > 0 toward +1, eps < 0 toward -1), 0 not used.")
@click.option("--name", required=True)
@click.option("--rank", type=click.IntRange(1, ops.MAX_FIT_RANK), default=8, show_default=True,
              help=f"Rank r of W (1..{ops.MAX_FIT_RANK}, as over HTTP; at most the model's hidden size).")
@click.option("--steps", type=click.IntRange(1, ops.MAX_FIT_STEPS), default=200, show_default=True,
              help=f"Adam steps (1..{ops.MAX_FIT_STEPS}, as over HTTP).")
@click.option("--eps", type=float, default=1e-3, show_default=True, help="Training scale eps0.")
@click.option("--lr", type=float, default=1e-2, show_default=True)
@register_opts
@click.pass_obj
def lm_steer_fit(obj: Ctx, texts, labels, name, rank, steps, eps, lr, random_state, alias, description, as_json,
                 quiet):
    """Train an LM steer on labelled texts (model body frozen) and register it in space ``lm.<model>``."""
    items = read_texts(texts, check_text=False)  # its tokenizer keeps U+200B and the like, as POST /v1/lm/steers
    spec = ops.LMFit(name=name, texts=items, labels=read_labels(labels, len(items)).tolist(), rank=rank, eps=eps,
                     steps=steps, lr=lr, random_state=random_state, alias=alias, description=description,
                     inputs={"via": "cli", "texts": str(Path(texts).resolve()), "labels": str(Path(labels).resolve())})
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        v = ops.fit_steer(obj.registry, _lm_of(obj, bars=_bars(quiet=quiet, as_json=as_json)), spec, progress)
    finally:
        close()
    emit(v.to_dict(), as_json, f"registered LM steer {v.ref} (rank {v.rank}, space {v.space})"
                               f"{' as @' + alias if alias else ''}")


@lm.command("generate")
@click.option("--prompt", required=True)
@click.option("--steer", "steers", multiple=True, help="REF=EPS, repeatable (composed by summation).")
@click.option("--max-new-tokens", type=click.IntRange(1, MAX_NEW_TOKENS), default=30, show_default=True)
@click.option("--temperature", type=FiniteRange(0, 10), default=1.0, show_default=True,
              help="Sampling temperature (sampling with --top-p is the default); 0: greedy.")
@click.option("--top-p", type=FiniteRange(0.01, 1.0), default=0.9, show_default=True)
@random_state_opt
@json_opt
@click.pass_obj
def lm_generate(obj: Ctx, prompt, steers, max_new_tokens, temperature, top_p, random_state, as_json):
    """Continue PROMPT under the given steers (prints the continuation)."""
    wanted = _steer_eps(steers)  # a bad REF=EPS is said before the registry is opened
    registry = obj.registry if steers else None  # unsteered generation needs no registry (none is created)
    out = ops.generate(registry, _lm_of(obj, bars=_bars(as_json=as_json)), prompt, wanted,
                       max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, random_state=random_state)
    emit(out, as_json, out["text"])


@lm.command("analyze")
@click.option("--text", required=True)
@click.option("--steer", "ref", required=True, help="NAME, NAME@alias or NAME:version.")
@click.option("--eps", type=float, default=1.0, show_default=True,
              help=f"Compare +eps with -eps: in (0, {ops.MAX_LM_EPS:g}]; 1 is the trained strength.")
@json_opt
@click.pass_obj
def lm_analyze(obj: Ctx, text, ref, eps, as_json):
    """Per-token evidence of a steer in TEXT: log p(+eps) - log p(-eps) of each token."""
    out = ops.analyze(obj.registry, _lm_of(obj, bars=_bars(as_json=as_json)), text, ref, eps=eps)
    emit(out, as_json, "\n".join(f"{t['score']:+8.3f}  {t['token']}" for t in out["tokens"]))
