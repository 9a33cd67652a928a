"""LM-Steer on a causal LM: steered logits, fitting, generation, perplexity and the lens.

A causal LM computes ``logits = h E^T`` from the final hidden state ``h`` (after the last norm)
and the output embeddings ``E`` (vocab, d). With steers ``(W_i, eps_i)``

.. math::  \\mathrm{logits} = h\\,(I + \\textstyle\\sum_i \\varepsilon_i W_i)\\,E^\\top,
           \\qquad W_i = P_{1,i} P_{2,i}^\\top ,

applied by a forward pre-hook on the output-embedding module (so ``generate`` and the KV cache
work unchanged). Steers are :class:`align.Steer` objects of dimension ``d`` (the hidden size).

Fitting (:func:`fit_lm_steer`) follows LM-Steer (Han et al., 2024): the body is frozen, each
training text carries a steer value ``s`` in {+1, -1}, the loss is the ordinary next-token
cross-entropy of ``h (I + eps0 (s W + W_dummy)) E^T`` where ``eps0`` is a small fixed scale and the
optional *dummy steer* ``W_dummy`` (value 1 on every text, dropped afterwards) absorbs what all
training texts share (domain, register), leaving ``W`` the difference between the two labels.
Because the steer sits after the body, the hidden states are computed once (no gradient through
the body) and training touches only the ``2 d r`` steer parameters. The returned steer has
``eps0`` folded in, so ``eps = 1`` is the trained strength.

Lens: :func:`word_dimensions` (SVD of ``W``; vocabulary items at both ends of each singular
direction) and :func:`token_evidence` (``log p_+(x_t) - log p_-(x_t)`` per token).
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from align.exceptions import DimensionMismatchError, InputError, NonFiniteError
from align.steer import Steer, compose_steers
from align.validation import check_eps, check_labels

from .model import MIN_TEMPERATURE

__all__ = [
    "output_embeddings", "steered", "steered_logits", "fit_lm_steer", "fit_lm_steer_ids", "final_hidden_states",
    "generate", "generate_batch",
    "perplexity", "token_evidence", "evidence_spans", "word_dimensions",
]

SteerSpec = Sequence[tuple[Steer, float]]


# --------------------------------------------------------------------------------------------
# the hook
# --------------------------------------------------------------------------------------------
def output_embeddings(model) -> torch.Tensor:
    """``E`` (vocab, d): the weight of the model's output-embedding layer (detached)."""
    head = model.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None:
        raise InputError("model needs a bias-free output-embedding layer (logits = h E^T)")
    return head.weight.detach()


def _hidden_size(model) -> int:
    return int(output_embeddings(model).shape[1])


def _composed(model, steers: SteerSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
    pairs = [(s, check_eps(e)) for s, e in steers]
    pairs = [(s, e) for s, e in pairs if e != 0.0]
    if not pairs:
        return None
    d = _hidden_size(model)
    comp = compose_steers(pairs)
    if comp.dim != d:
        raise DimensionMismatchError(f"steer is {comp.dim}-d, the model's hidden size is {d}")
    dtype = output_embeddings(model).dtype
    return torch.from_numpy(comp.P1).to(dtype), torch.from_numpy(comp.P2).to(dtype)


def _steer_hidden(h: torch.Tensor, P1: torch.Tensor, P2: torch.Tensor) -> torch.Tensor:
    return h + (h @ P1) @ P2.T


@contextlib.contextmanager
def steered(model, steers: SteerSpec = ()):
    """Context manager: inside it every forward pass of ``model`` uses ``h (I + sum eps_i W_i) E^T``.

    ``steers`` is a sequence of ``(Steer, eps)``; all-zero ``eps`` leaves the model untouched.
    """
    factors = _composed(model, list(steers))
    if factors is None:
        yield model
        return
    P1, P2 = factors

    def hook(module, args):
        return (_steer_hidden(args[0], P1, P2), *args[1:])

    def finite(module, args, logits):
        # a large eps overflows float32 in h (I + eps W) E^T: the sampler then failed (a 500) and greedy decoding
        # returned words chosen among Inf/NaN logits
        if not torch.isfinite(logits).all():
            raise NonFiniteError("the steered logits are not finite (float32 overflow); use a smaller eps")

    head = model.get_output_embeddings()
    handles = [head.register_forward_pre_hook(hook), head.register_forward_hook(finite)]
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _capture_hidden(model, store: list):
    """Record the input of the output-embedding layer (the final hidden states ``h``)."""
    handle = model.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: store.append(args[0].detach()))
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def steered_logits(model, input_ids, steers: SteerSpec = (), attention_mask=None) -> torch.Tensor:
    """Logits (batch, seq, vocab) of ``input_ids`` (batch, seq) under the given steers."""
    ids = torch.as_tensor(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    with steered(model, steers):
        return model(input_ids=ids, attention_mask=attention_mask).logits


# --------------------------------------------------------------------------------------------
# fitting
# --------------------------------------------------------------------------------------------
def _encode(tokenizer, texts: Iterable[str], max_length: int) -> list[list[int]]:
    out = []
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            raise InputError("every text must be a non-empty string")
        out.append(list(tokenizer(t, truncation=True, max_length=max_length)["input_ids"]))
    return out


def trainable(ids_list: Sequence[Sequence[int]], labels) -> list[int]:
    """Indices of the texts a fit learns from: labelled (+1 / -1) with two or more tokens (a token's
    next token is the signal; a one-token text has none). InputError unless both labels keep one."""
    labels = check_labels(labels, len(ids_list))
    keep = [i for i in range(len(ids_list)) if labels[i] != 0 and len(ids_list[i]) >= 2]
    for lab, word in ((1, "+1"), (-1, "-1")):
        if not any(labels[i] == lab for i in keep):
            raise InputError(f"no {word} text has two or more tokens: LM-Steer learns from each token's next "
                             f"token, so a one-token text teaches nothing; give longer {word} texts")
    return keep


def check_trainable(tokenizer, texts: Sequence[str], labels, max_length: int = 64) -> None:
    """:func:`trainable` on ``texts`` as :func:`fit_lm_steer` tokenises them (a check before a fit job)."""
    trainable(_encode(tokenizer, texts, max_length), labels)


@torch.no_grad()
def _hidden_states(model, ids_list: Sequence[Sequence[int]], batch_size: int = 16,
                   progress: Callable[[float], None] | None = None) -> list[torch.Tensor]:
    """Final hidden states (len, d) of each sequence.

    Sequences are run in right-padded batches of similar length (causal attention: a token never
    sees the padding after it, so the states equal those of one-by-one passes up to float error).
    ``progress(fraction)`` is called after each batch (a job's cancellation point).
    """
    out: list = [None] * len(ids_list)
    order = sorted(range(len(ids_list)), key=lambda i: len(ids_list[i]))
    for s in range(0, len(order), batch_size):
        if progress is not None:
            progress(s / max(len(order), 1))
        part = order[s : s + batch_size]
        L = max(len(ids_list[i]) for i in part)
        ids = torch.zeros((len(part), L), dtype=torch.long)
        mask = torch.zeros((len(part), L), dtype=torch.long)
        for j, i in enumerate(part):
            n = len(ids_list[i])
            ids[j, :n] = torch.as_tensor(list(ids_list[i]))
            mask[j, :n] = 1
        store: list = []
        with _capture_hidden(model, store):
            model(input_ids=ids, attention_mask=mask)
        for j, i in enumerate(part):
            out[i] = store[-1][j, : len(ids_list[i])].clone()
    return out


def final_hidden_states(model, ids_list: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Final hidden states ``h`` (len_i, d) of each token sequence (what :func:`fit_lm_steer_ids` trains on;
    callers that fit several steers on one corpus compute them once and pass ``hidden_states``)."""
    return _hidden_states(model, ids_list)


def fit_lm_steer(model, tokenizer, texts: Sequence[str], labels, *, max_length: int = 64,
                 model_lock=None, **kw) -> Steer:
    """Train an LM-Steer steer on labelled texts (``labels`` +1 wanted style, -1 opposite, 0 ignored).

    Tokenises with ``tokenizer`` then calls :func:`fit_lm_steer_ids`; keyword arguments go there.
    ``model_lock`` (a lock shared with other users of the model and tokenizer) is held while tokenising
    and during the forward pass only.
    """
    texts = list(texts)
    with model_lock or contextlib.nullcontext():
        ids = _encode(tokenizer, texts, max_length)
    steer = fit_lm_steer_ids(model, ids, labels, model_lock=model_lock, **kw)
    steer.metadata["n_texts"] = len(texts)
    return steer


@torch.no_grad()
def _base_logits(H: torch.Tensor, E: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    """``H E^T`` in float16, computed ``chunk`` rows at a time (no float32 copy of the whole)."""
    out = torch.empty((H.shape[0], E.shape[0]), dtype=torch.float16)
    for s in range(0, H.shape[0], chunk):
        out[s : s + chunk] = H[s : s + chunk] @ E.T
    return out


@torch.no_grad()
def _chunked_ce(H, Y, E, cached=None, chunk: int = 2048) -> float:
    """Mean unsteered cross-entropy of next tokens ``Y`` from states ``H`` (cached base logits if given)."""
    tot = 0.0
    for s in range(0, H.shape[0], chunk):
        lg = cached[s : s + chunk].float() if cached is not None else H[s : s + chunk] @ E.T
        tot += float(torch.nn.functional.cross_entropy(lg, Y[s : s + chunk], reduction="sum"))
    return tot / H.shape[0]


def fit_lm_steer_ids(model, ids_list: Sequence[Sequence[int]], labels, *, rank: int = 32, epsilon: float = 1e-3,
                     init_var: float = 1e-2, lr: float = 1e-2, n_steps: int = 200, batch_tokens: int = 256,
                     regularization: float = 0.0, dummy_steer: bool = True, random_state: int = 0,
                     val_fraction: float = 0.0, eval_every: int = 25, patience: int = 4, kl_weight: float = 0.0,
                     hidden_states: Sequence[torch.Tensor] | None = None, cache_logits: bool = False,
                     progress: Callable[[int, float], None] | None = None, model_lock=None,
                     encode_progress: Callable[[float], None] | None = None) -> Steer:
    """Train ``W = P1 P2^T`` with the LM loss on token sequences, body frozen (``ALGORITHMS.md`` §6).

    Parameters
    ----------
    model : a transformers causal LM whose logits are ``h E^T``
    ids_list : sequences of token ids, one per text
    labels : (n_texts,) steer values in {-1, 0, +1} (0: not used for training)
    rank : int
        ``r``; the steer has ``2 d r`` parameters.
    epsilon : float
        Fixed scale ``eps0`` of the steer during training (LM-Steer's ``epsilon``), folded into
        ``P1`` on return.
    init_var : float
        Standard deviation of the random initial factors.
    lr, n_steps, batch_tokens : Adam learning rate, steps, tokens per step (sampled with replacement).
    regularization : float
        Weight of ``|P1|^2 + |P2|^2`` in the loss.
    dummy_steer : bool
        Train a second steer with value 1 on every text and drop it (absorbs the shared domain).
    random_state : int
    val_fraction : float
        Share of the labelled texts held out (stratified by label, seeded); with it the
        held-out loss is evaluated every ``eval_every`` steps, the best factors are kept and
        training stops after ``patience`` evaluations without improvement (early stopping).
    kl_weight : float
        Weight ``beta`` of ``KL(p_base || p_steer)`` averaged over the batch tokens, where ``p_steer``
        uses ``s W`` (the dummy left out): a penalty on moving the next-token distribution more
        than the labels ask, against steers that pile probability on one word (degenerate loops).
    hidden_states : optional, one (len_i, d) tensor per sequence from :func:`final_hidden_states`
        (computed here when omitted; the body's forward pass is most of a short fit's cost).
    cache_logits : bool
        Compute the unsteered logits ``h E^T`` of every training and held-out token once (float16,
        ``2 * n_tokens * vocab`` bytes) instead of at every step. The steered logits are evaluated
        as ``h E^T + eps0 (s h P1)(E P2)^T`` either way (exact; the gradient never touches the
        ``d x vocab`` product), so with the cache a step costs ``O(batch * rank * vocab)``: long
        fits to convergence become cheap, at the price of float16 rounding of the base logits.
    progress : callable ``(step, loss)``, optional
    model_lock : optional lock held during the forward pass of the body (the steps never run the model)
    encode_progress : callable ``(fraction)`` called during that forward pass, optional

    Returns
    -------
    align.Steer of dimension ``d``; ``metadata`` holds the loss curve summary.
    """
    labels = check_labels(labels, len(ids_list))
    E = output_embeddings(model)
    d = int(E.shape[1])
    if not 1 <= int(rank) <= d:
        raise InputError(f"rank must be in [1, {d}], got {rank}")
    keep = trainable(ids_list, labels)
    if not 0.0 <= float(val_fraction) < 1.0:
        raise InputError(f"val_fraction must be in [0, 1), got {val_fraction}")
    rng = np.random.default_rng(int(random_state))
    held: list[int] = []
    if val_fraction > 0:
        for lab in (1, -1):
            grp = [i for i in keep if labels[i] == lab]
            held += list(rng.permutation(grp)[: int(round(len(grp) * val_fraction))])
    held_set = set(held)
    train = [i for i in keep if i not in held_set]
    if not train:
        raise InputError("no training text left after the held-out split")
    if hidden_states is not None:
        if len(hidden_states) != len(ids_list) or any(
                tuple(hidden_states[i].shape) != (len(ids_list[i]), d) for i in keep):
            raise InputError("hidden_states must hold one (len_i, d) tensor per sequence of ids_list")
        hs = {i: hidden_states[i] for i in keep}
    else:
        with model_lock or contextlib.nullcontext():
            hs = dict(zip(keep, _hidden_states(model, [ids_list[i] for i in keep], progress=encode_progress)))

    def tokens(rows):
        H = torch.cat([hs[i][:-1] for i in rows])                                  # (N, d) contexts
        Y = torch.cat([torch.as_tensor(list(ids_list[i][1:])) for i in rows])      # (N,) next tokens
        S = torch.cat([torch.full((len(ids_list[i]) - 1,), float(labels[i])) for i in rows])  # (N,)
        return H, Y, S

    H, Y, S = tokens(train)
    Hv, Yv, Sv = tokens(held) if held else (None, None, None)
    with torch.no_grad():
        B0 = _base_logits(H, E) if cache_logits else None                         # (N, vocab) float16
        Bv = _base_logits(Hv, E) if cache_logits and held else None

    gen = torch.Generator().manual_seed(int(random_state))
    n_slots = 2 if dummy_steer else 1
    P1 = (torch.randn(n_slots, d, rank, generator=gen) * init_var).requires_grad_(True)
    P2 = (torch.randn(n_slots, d, rank, generator=gen) * init_var).requires_grad_(True)
    opt = torch.optim.Adam([P1, P2], lr=lr)

    def steered_logits_(h, s, base):
        # (h + eps0 sum_k v_k (h P1_k) P2_k^T) E^T  ==  h E^T + eps0 sum_k v_k (h P1_k) (E P2_k)^T
        values = torch.stack([s, torch.ones_like(s)], 1)[:, :n_slots]          # (b, slots)
        A = torch.einsum("bd,kdr->bkr", h, P1)                                   # (b, slots, r)
        EP2 = torch.einsum("vd,kdr->vkr", E, P2).reshape(E.shape[0], -1)         # (vocab, slots * r)
        U = (values[:, :, None] * A).reshape(h.shape[0], -1)                     # (b, slots * r)
        if base is None:
            with torch.no_grad():
                base = h @ E.T
        return base.float() + epsilon * (U @ EP2.T), A, EP2

    def held_loss() -> float:
        with torch.no_grad():
            tot = 0.0
            for s0 in range(0, Hv.shape[0], 2048):
                sl = slice(s0, s0 + 2048)
                lg, _, _ = steered_logits_(Hv[sl], Sv[sl], Bv[sl] if Bv is not None else None)
                tot += float(torch.nn.functional.cross_entropy(lg, Yv[sl], reduction="sum"))
            return tot / Hv.shape[0]

    losses, val_curve = [], []
    best = (float("inf"), P1.detach().clone(), P2.detach().clone(), 0)
    bad = 0
    for step in range(int(n_steps)):
        idx = torch.randint(0, H.shape[0], (min(batch_tokens, H.shape[0]),), generator=gen)
        h, y, s = H[idx], Y[idx], S[idx]
        base = B0[idx].float() if B0 is not None else (h @ E.T).detach()
        logits, A, EP2 = steered_logits_(h, s, base)
        loss = torch.nn.functional.cross_entropy(logits, y)
        total = loss + regularization * (P1.pow(2).sum() + P2.pow(2).sum())
        if kl_weight > 0:
            base_lp = torch.log_softmax(base, -1)
            lp = torch.log_softmax(base + epsilon * (s[:, None] * A[:, 0]) @ EP2[:, :rank].T, -1)
            total = total + kl_weight * (base_lp.exp() * (base_lp - lp)).sum(-1).mean()
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step + 1, losses[-1])
        if held and ((step + 1) % int(eval_every) == 0 or step + 1 == int(n_steps)):
            v = held_loss()
            val_curve.append([step + 1, v])
            if v < best[0] - 1e-4:
                best, bad = (v, P1.detach().clone(), P2.detach().clone(), step + 1), 0
            else:
                bad += 1
                if bad >= int(patience):
                    break
    if held:
        P1, P2 = best[1], best[2]
    with torch.no_grad():
        base = _chunked_ce(H, Y, E, B0)
    meta = {
        "method": "lm-steer", "model": getattr(model.config, "name_or_path", "") or type(model).__name__,
        "hidden_size": d, "params": {"rank": int(rank), "epsilon": epsilon, "init_var": init_var, "lr": lr,
                                     "n_steps": int(n_steps), "batch_tokens": int(batch_tokens),
                                     "regularization": regularization, "dummy_steer": bool(dummy_steer),
                                     "random_state": int(random_state), "val_fraction": float(val_fraction),
                                     "eval_every": int(eval_every), "patience": int(patience),
                                     "kl_weight": float(kl_weight), "cache_logits": bool(cache_logits)},
        "n_tokens": int(H.shape[0]), "n_pos": int((labels == 1).sum()), "n_neg": int((labels == -1).sum()),
        "loss_base": base, "loss_first": losses[0], "loss_last10": float(np.mean(losses[-10:])),
        "steps_run": len(losses),
    }
    if held:
        meta.update({"n_heldout_texts": len(held), "n_heldout_tokens": int(Hv.shape[0]), "val_curve": val_curve,
                     "best_step": best[3], "val_loss_best": best[0],
                     "val_loss_base": _chunked_ce(Hv, Yv, E, Bv)})
    return Steer(epsilon * P1[0].detach().numpy(), P2[0].detach().numpy(), meta)


# --------------------------------------------------------------------------------------------
# using a steer
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def generate(model, tokenizer, prompt: str, steers: SteerSpec = (), *, max_new_tokens: int = 30,
             do_sample: bool = True, top_p: float = 0.9, temperature: float = 1.0, seed: int = 0) -> str:
    """Continue ``prompt`` under the given steers; returns the continuation text only.

    Sampling divides the logits by ``temperature``; below :data:`MIN_TEMPERATURE` they overflow to
    inf (the sampler then fails), so such a temperature is an :class:`~align.exceptions.InputError`:
    ask for greedy decoding (``do_sample=False``) instead.
    """
    if do_sample and not MIN_TEMPERATURE <= temperature:
        raise InputError(f"temperature {temperature:g} is too small to sample with (logits overflow); use "
                         f"0 for greedy decoding or at least {MIN_TEMPERATURE:g}")
    ids = tokenizer(prompt, return_tensors="pt")
    torch.manual_seed(int(seed))
    kw = {"do_sample": do_sample, "max_new_tokens": int(max_new_tokens)}
    if do_sample:
        kw.update(top_p=top_p, temperature=temperature)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with steered(model, steers):
        out = model.generate(**ids, pad_token_id=pad, **kw)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


@torch.no_grad()
def generate_batch(model, tokenizer, prompts: Sequence[str], steers: SteerSpec = (), *, max_new_tokens: int = 30,
                   do_sample: bool = True, top_p: float = 0.9, temperature: float = 1.0, seed: int = 0,
                   batch_size: int = 32) -> list[str]:
    """Continue each prompt under the given steers, ``batch_size`` prompts per forward (left padding).

    Sampling is seeded once per batch (``seed + batch index``), so a run is reproducible for a
    fixed ``batch_size``; continuations only, special tokens dropped.
    """
    prompts = list(prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    side = tokenizer.padding_side
    out: list[str] = []
    try:
        tokenizer.padding_side = "left"
        with steered(model, steers):
            for b, s in enumerate(range(0, len(prompts), batch_size)):
                enc = tokenizer(prompts[s : s + batch_size], return_tensors="pt", padding=True)
                torch.manual_seed(int(seed) + b)
                kw = {"do_sample": do_sample, "max_new_tokens": int(max_new_tokens)}
                if do_sample:
                    kw.update(top_p=top_p, temperature=temperature)
                gen = model.generate(**enc, pad_token_id=pad, **kw)
                out += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return out


@torch.no_grad()
def perplexity(model, tokenizer, texts: Sequence[str], steers: SteerSpec = (), *,
               prompts: Sequence[str] | None = None, max_length: int = 128) -> float:
    """``exp`` of the mean next-token NLL over ``texts`` under the steers.

    With ``prompts`` (same length as ``texts``), each text is scored as the continuation of its
    prompt and only the continuation tokens count.
    """
    texts = list(texts)
    if prompts is not None and len(prompts) != len(texts):
        raise InputError("prompts and texts must have the same length")
    nll, count = 0.0, 0
    with steered(model, steers):
        for i, t in enumerate(texts):
            p_ids = _encode(tokenizer, [prompts[i]], max_length)[0] if prompts is not None else []
            t_ids = list(tokenizer(t, add_special_tokens=prompts is None)["input_ids"])
            ids = (p_ids + t_ids)[:max_length]
            start = max(len(p_ids), 1)
            if len(ids) <= start:
                continue
            logp = torch.log_softmax(model(input_ids=torch.as_tensor([ids])).logits[0, :-1], -1)
            tgt = torch.as_tensor(ids[1:])
            lp = logp[torch.arange(len(tgt)), tgt][start - 1:]
            nll -= float(lp.sum())
            count += int(lp.numel())
    if count == 0:
        raise InputError("no tokens to score")
    return math.exp(nll / count)


@torch.no_grad()
def token_evidence(model, tokenizer, steer: Steer, text: str, *, eps: float = 1.0,
                   chunk: int = 256) -> list[tuple[str, float]]:
    """Per-token evidence ``log p_{+eps}(x_t | x_<t) - log p_{-eps}(x_t | x_<t)`` for ``t >= 1``.

    Positive values mark tokens the steer's wanted style makes more likely. The (tokens, vocab) logits
    are computed ``chunk`` tokens at a time; an ``eps`` so large that the evidence overflows is a
    NonFiniteError.
    """
    eps = check_eps(eps)
    ids = _encode(tokenizer, [text], 10_000)[0]
    if len(ids) < 2:
        raise InputError("text needs at least two tokens")
    h = _hidden_states(model, [ids])[0][:-1]
    E = output_embeddings(model)
    P1, P2 = torch.from_numpy(steer.P1), torch.from_numpy(steer.P2)
    tgt = torch.as_tensor(ids[1:])
    ev = []
    for s in range(0, len(tgt), chunk):
        hs, ts = h[s : s + chunk], tgt[s : s + chunk]
        rows = torch.arange(len(ts))
        lp = [torch.log_softmax(_steer_hidden(hs, sign * eps * P1, P2) @ E.T, -1)[rows, ts] for sign in (1.0, -1.0)]
        ev += (lp[0] - lp[1]).tolist()
    if not all(math.isfinite(v) for v in ev):
        raise NonFiniteError(f"the evidence at eps={eps:g} is not finite (float32 overflow); use a smaller eps")
    return [(tokenizer.decode([i]), float(v)) for i, v in zip(ids[1:], ev)]


def evidence_spans(evidence: Sequence[tuple[str, float]], *, threshold: float = 0.5) -> list[dict]:
    """Group consecutive tokens whose evidence has one sign and ``|value| >= threshold`` into spans.

    Returns ``[{"text", "start", "end", "sign", "score"}]`` (token positions, end exclusive, score = sum).
    """
    spans, cur = [], None
    for i, (tok, v) in enumerate(evidence):
        sign = 1 if v >= threshold else (-1 if v <= -threshold else 0)
        if sign and cur is not None and cur["sign"] == sign:
            cur["text"] += tok
            cur["end"] = i + 1
            cur["score"] += v
            continue
        if cur is not None:
            spans.append(cur)
            cur = None
        if sign:
            cur = {"text": tok, "start": i, "end": i + 1, "sign": sign, "score": v}
    if cur is not None:
        spans.append(cur)
    return spans


def word_dimensions(model, tokenizer, steer: Steer, *, k: int = 10, n_directions: int = 4) -> list[dict]:
    """The lens: singular directions of ``W`` with the vocabulary items at each end (see :meth:`Steer.lens`).

    No queries orient the ends: ``positive``/``negative`` follow :meth:`Steer.svd`'s sign convention (stable across
    calls), not what ``eps > 0`` promotes."""
    E = output_embeddings(model).numpy()
    if E.shape[1] != steer.dim:
        raise DimensionMismatchError(f"steer is {steer.dim}-d, the model's hidden size is {E.shape[1]}")
    vocab = [tokenizer.decode([i]) for i in range(E.shape[0])]
    return steer.lens(E, vocab, k=k, n_directions=min(n_directions, steer.rank))
