"""The steer and LM-Steer calls of :class:`service.client.Client` and ``AsyncClient`` (a mixin of sans-IO
generators, :mod:`service.client_core`: the same requests, retries and batches as every other call, through
``_json`` / ``_pages`` / ``_batched``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .client_core import call
from .client_wire import (
    alias_if_match,
    as_ints,
    as_list,
    as_real,
    b64,
    b64_row_bytes,
    clean,
    matrix,
    new_key,
    rows,
)
from .client_wire import seg as _seg

__all__ = ["SteerCalls"]


class SteerCalls:
    """Steers of one embedding space (``/v1/steers``) and the language model's (``/v1/lm``)."""

    # --- steers ---------------------------------------------------------------------------------
    @call
    def list_steers(self) -> list[dict]:
        return (yield from self._pages("/v1/steers"))

    @call
    def get_steer(self, ref: str) -> dict:
        return (yield from self._json("GET", f"/v1/steers/{_seg(ref)}"))

    @call
    def list_steer_versions(self, name: str, *, include_deleted: bool = True) -> list[dict]:
        """Every version of steer ``name`` (as :meth:`get_steer` shows one: ``aliases``, ``metrics.reliable``...),
        oldest first, as ``list_versions`` for a map."""
        return (yield from self._pages(f"/v1/steers/{_seg(name)}/versions", {"include_deleted": include_deleted}))

    @call
    def fit_steer(self, name: str, space: str, labels: Sequence[int], vectors=None, *,
                  texts: Sequence[str] | None = None, items: Sequence[str] | None = None, encoder: str | None = None,
                  params: dict | None = None, random_state: int = 0, alias: str | None = None,
                  description: str = "", idempotency_key: str | None = None) -> dict:
        """Queue a steer fit (rows ``vectors`` (n, d) or ``texts``, ``labels`` +1 / -1 / 0); returns the job."""
        body = clean({"name": name, "space": space, "labels": as_ints(labels, "labels"), "texts": as_list(texts),
                       "items": as_list(items), "encoder": encoder, "params": params or {},
                       "random_state": random_state, "alias": alias, "description": description})
        if vectors is not None:
            body.update(b64(vectors))
        headers = {"Idempotency-Key": idempotency_key or new_key()}
        return (yield from self._json("POST", "/v1/steers", json=body, headers=headers))

    @call
    def apply_steer(self, ref: str, X, *, eps: float = 1.0) -> np.ndarray:
        """``X (I + eps W)`` for rows ``X`` (n, d) of the steer's space; returns float32 (n, d)."""
        A, pin, eps = matrix(X), [ref], as_real(eps, "eps")  # float(True) was sent as 1.0

        def send(part: slice) -> np.ndarray:  # batches after the first go through the version it used
            body = yield from self._json("POST", f"/v1/steers/{_seg(pin[0])}/apply", json={**b64(A[part]), "eps": eps},
                                         retry=True)
            pin[0] = body.get("steer") or pin[0]
            return rows(body)

        parts = yield from self._batched(A.shape[0], b64_row_bytes(A.shape[1]), send)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @call
    def get_steer_alias(self, name: str, alias: str) -> dict:
        """``{"name", "alias", "version"}``: the version ``name@alias`` points at (a deleted one too), else
        NotFoundError."""
        return (yield from self._json("GET", f"/v1/steers/{_seg(name)}/aliases/{_seg(alias)}"))

    @call
    def set_steer_alias(self, name: str, alias: str, version: int, *, expected: int | None = None) -> dict:
        """Point ``name@alias`` at ``version``; ``expected``: only while it points there (0: unset), else 409."""
        return (yield from self._json("PUT", f"/v1/steers/{_seg(name)}/aliases/{_seg(alias)}", json=clean({
            "version": self._ver(version), "expected_version": self._expected(expected)})))

    @call
    def delete_steer_alias(self, name: str, alias: str, *, expected: int | None = None) -> None:
        """Remove ``name@alias`` (a bare ``name`` released from ``prod`` means its newest live version); ``expected``:
        only while it points at that version, else 412."""
        yield from self._json("DELETE", f"/v1/steers/{_seg(name)}/aliases/{_seg(alias)}",
                              headers=alias_if_match(expected))

    @call
    def delete_steer_version(self, name: str, version: int) -> dict:
        """Soft delete, as for map versions; the answer's ``bare_ref`` (``name:N`` or None) is what a bare ``name``
        resolves to now."""
        return (yield from self._json("DELETE", f"/v1/steers/{_seg(name)}/versions/{self._ver(version)}"))

    @call
    def transfer_steer(self, ref: str, map: str, *, name: str | None = None, alias: str | None = None,
                       description: str = "") -> dict:
        """Carry steer ``ref`` through ``map`` (``W_B = H^T W_A H``) and register it in the map's target space, as
        ``name`` (default ``{steer's name}-{target space}``)."""
        return (yield from self._json("POST", f"/v1/steers/{_seg(ref)}/transfer", json=clean({
            "map": map, "name": name, "alias": alias, "description": description})))

    @call
    def steer_lens(self, ref: str, *, k: int = 5, n_directions: int = 4) -> dict:
        return (yield from self._json("GET", f"/v1/steers/{_seg(ref)}/lens",
                                      params={"k": k, "n_directions": n_directions}))

    # --- language model (LM-Steer) --------------------------------------------------------------
    @call
    def lm_fit_steer(self, name: str, texts: Sequence[str], labels: Sequence[int], *, rank: int = 8,
                     eps: float = 1e-3, steps: int = 200, lr: float = 1e-2, random_state: int = 0,
                     alias: str | None = None, description: str = "", idempotency_key: str | None = None) -> dict:
        """Queue an LM-Steer fit on the service's language model; returns the job."""
        body = clean({"name": name, "texts": as_list(texts), "labels": as_ints(labels, "labels"), "rank": rank,
                       "eps": eps, "steps": steps, "lr": lr, "random_state": random_state, "alias": alias,
                       "description": description})
        headers = {"Idempotency-Key": idempotency_key or new_key()}
        return (yield from self._json("POST", "/v1/lm/steers", json=body, headers=headers))

    @call
    def lm_generate(self, prompt: str, steers: dict[str, float] | None = None, *, max_new_tokens: int | None = None,
                    temperature: float | None = None, top_p: float | None = None,
                    random_state: int | None = None) -> dict:
        """Continue ``prompt`` under ``{steer ref: eps}``; ``text`` is the continuation only. An option left None
        is the service's default (sampling at temperature 1.0 with top_p 0.9, seed 0; 30 new tokens or the
        operator's ``limits.lm_max_new_tokens`` when lower); ``temperature=0`` decodes greedily."""
        return (yield from self._json("POST", "/v1/lm/generate", json=clean({
            "prompt": prompt, "steers": steers or {}, "max_new_tokens": max_new_tokens,
            "temperature": temperature, "top_p": top_p, "random_state": random_state}), retry=True))

    @call
    def lm_analyze(self, text: str, steer: str, *, eps: float = 1.0, threshold: float = 0.5) -> dict:
        """Per-token evidence of ``steer`` in ``text`` (``tokens`` and ``spans``)."""
        return (yield from self._json("POST", "/v1/lm/analyze", json={"text": text, "steer": steer, "eps": eps,
                                                                      "threshold": threshold}, retry=True))
