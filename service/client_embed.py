"""The encoder calls of :class:`service.client.Client` and ``AsyncClient``: ``GET /v1/models`` and
``POST /v1/embeddings`` (a mixin of sans-IO generators, :mod:`service.client_core`: the same requests, retries and
batches as every other call)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .client_core import call
from .client_errors import ValidationError
from .client_wire import as_list, b64_bytes, clean, json_sizes, pinned
from .client_wire import seg as _seg

__all__ = ["EmbedCalls"]


class EmbedCalls:
    """The installed encoders and embeddings (``/v1/models``, ``/v1/embeddings``)."""

    # --- embeddings -----------------------------------------------------------------------------
    @call
    def list_models(self) -> list[dict]:
        """Installed encoders (``GET /v1/models``)."""
        return (yield from self._json("GET", "/v1/models"))["data"]

    @call
    def get_model(self, name: str) -> dict:
        """One encoder's entry (``GET /v1/models/{name}``; an alias such as ``minilm`` too), else NotFoundError."""
        return (yield from self._json("GET", f"/v1/models/{_seg(name)}"))

    @call
    def embed(self, texts: Sequence[str], model: str, *, target_space: str | None = None,
              map: str | Sequence[str] | None = None, input_type: str = "passage", truncate: bool = True,
              with_versions: bool = False, with_usage: bool = False) -> Any:
        """Embed ``texts`` with an installed encoder: (n, d) float32, optionally translated into ``target_space``
        (one string: (1, d), as the service embeds it).

        ``map`` (with ``target_space``): a map or a path (list) of maps to use instead of the registry's path. Texts
        sent in several batches (the service's limits) all go through the map versions the first batch used;
        ``with_versions=True`` returns ``(E, ["name:version", ...])``, that path of versions (empty: no map).

        ``truncate``: a text longer than the model reads (``max_tokens`` of :meth:`list_models`: MiniLM 256, mpnet
        384 word pieces; e5 reads any length) is embedded from its start (True) or refused (False:
        :class:`~service.client.ValidationError` naming it, its row of ``texts`` in the message and in ``details[0]
        ["loc"]``, nothing returned). Texts sent in several batches are checked batch by batch: the batches before
        the refused one were embedded (for nothing), and the message's "k of n texts are" counts its batch only.
        ``with_usage=True`` adds the answers' ``usage`` summed over the batches: ``{"prompt_tokens",
        "total_tokens", "truncated"}``, ``truncated`` the texts embedded from their start only. With both flags:
        ``(E, versions, usage)``."""
        texts = as_list(texts)
        pin = {"map": map}  # batches after the first: the versions it used (client_wire.pinned)
        path: list[list[str]] = []
        usage: dict[str, int] = {}

        def send(part: slice) -> list:
            try:
                answer = yield from self._json("POST", "/v1/embeddings", json=clean({
                    "input": texts[part], "model": model, "encoding_format": "base64", "target_space": target_space,
                    "input_type": input_type, "truncate": None if truncate is True else truncate, **pin}), retry=True)
            except ValidationError as e:  # the service counts the batch's rows: name the caller's
                for d in e.details:
                    loc = d.get("loc") if isinstance(d, dict) else None
                    if part.start and isinstance(loc, list) and loc[:2] == ["body", "input"] and len(loc) > 2 \
                            and isinstance(loc[2], int):
                        d["loc"] = [*loc[:2], part.start + loc[2], *loc[3:]]
                        d.setdefault("ctx", {})["batch_rows"] = [part.start, part.stop - 1]
                raise
            pin.update(pinned(answer))
            if not path:
                path.append([f"{m['name']}:{m['version']}" for m in answer.get("maps") or []])
            for k, v in (answer.get("usage") or {}).items():
                usage[k] = usage.get(k, 0) + int(v)
            return answer["data"]

        parts = yield from self._batched(len(texts), json_sizes(texts, len(texts)), send, body="texts")
        data = [e for part in parts for e in part]
        E = np.stack([np.frombuffer(b64_bytes(e["embedding"]), dtype="<f4") for e in data])
        extra = ([path[0] if path else []] if with_versions else []) + ([usage] if with_usage else [])
        return (E, *extra) if extra else E
