"""LM-Steer on a real causal language model (optional extra: torch + transformers + gguf).

``ALGORITHMS.md`` §6: logits ``h E^T`` become ``h (I + sum_i eps_i W_i) E^T`` with
``W = P1 P2^T`` trained with the LM loss on texts labelled +1 / -1, body frozen. A trained LM
steer is an ordinary :class:`align.Steer` in the model's hidden space, so composition, transfer
and (de)serialisation are shared with the embedding-space steers.

Modules: :mod:`.model` (locate / load SmolLM2 from its wheel, no hub), :mod:`.steering`
(hooks, fitting, generation, perplexity, lens). torch is imported only when these are used::

    from service.lm import load_lm, fit_lm_steer, generate
"""

from __future__ import annotations

__all__ = [
    "load_lm", "smollm2_gguf_path", "LMUnavailableError",
    "steered", "fit_lm_steer", "fit_lm_steer_ids", "generate", "perplexity", "token_evidence",
    "evidence_spans", "word_dimensions", "steered_logits", "output_embeddings",
]

_MODEL = {"load_lm", "smollm2_gguf_path", "LMUnavailableError"}


def __getattr__(name):  # lazy: importing service.lm never imports torch
    if name in _MODEL:
        from . import model

        return getattr(model, name)
    if name in __all__:
        from . import steering

        return getattr(steering, name)
    raise AttributeError(name)
