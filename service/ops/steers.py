"""Steer registry use cases shared by the HTTP routes and the CLI: alias, delete, transfer.

Transfer carries a registered steer through a registered map ``x_B ≈ x_A M`` (``H^T W H`` with
``H = pinv(M)^T``, :func:`align.transfer_steer`) and registers the result as the next version of
a steer in the map's target space, with lineage (source steer and map versions) in its inputs.
"""

from __future__ import annotations

from align.exceptions import InputError
from align.steer import Steer

from ..registry.names import check_alias, check_name
from ..steering import apply_steer_job, transfer_steer_job

__all__ = ["set_steer_alias", "delete_steer_version", "transfer_and_register", "steer_queries"]


def set_steer_alias(registry, name: str, alias: str, version: int):
    """Point ``name@alias`` at ``version``; returns the SteerInfo of that version."""
    return registry.set_steer_alias(name, alias, int(version))


def delete_steer_version(registry, name: str, version: int):
    """Soft-delete one steer version (kept for lineage, no longer resolvable)."""
    return registry.delete_steer_version(name, int(version))


def transfer_and_register(registry, steer_ref: str, map_ref: str, *, name: str | None = None,
                          alias: str | None = None, description: str = "", load_map=None, load_steer=None):
    """Carry steer ``steer_ref`` through map ``map_ref`` and register it in the map's target space.

    ``name`` defaults to the source steer's name (it must then not already live in another space).
    ``load_map(ref) -> (VersionInfo, LinearMap)`` and ``load_steer(ref) -> (SteerInfo, Steer)``
    let a face reuse its caches; by default the registry loads them.
    """
    s_info, steer = (load_steer or (lambda r: _steer(registry, r)))(steer_ref)
    m_info, lmap = (load_map or (lambda r: _map(registry, r)))(map_ref)
    if not isinstance(steer, Steer):
        raise InputError(f"steer {s_info.ref} is a mean-shift baseline; only W = P1 P2^T steers transfer")
    if m_info.source_space != s_info.space:
        raise InputError(f"map {m_info.ref} goes from {m_info.source_space!r}, but steer {s_info.ref} "
                         f"lives in {s_info.space!r}")
    target = m_info.target_space
    name = name or s_info.name
    check_name(name, "steer name")
    if alias is not None:
        check_alias(alias)
    moved = transfer_steer_job(steer, lmap, target_space=target)
    return registry.register_steer(
        name, moved, space=target, params={"method": "transfer", "steer": s_info.ref, "map": m_info.ref},
        metrics={"approximate": bool(moved.metadata.get("approximate"))}, alias=alias, description=description,
        inputs={"via": "transfer", "steer": s_info.ref, "map": m_info.ref},
        lens=[])


def _steer(registry, ref):
    info = registry.resolve_steer(ref)
    return info, registry.load_steer(info)


def _map(registry, ref):
    v = registry.resolve(ref)
    return v, registry.load_map(v)


def steer_queries(Q, steers: dict[str, float], space: str, *, load_steer) -> tuple:
    """Queries ``Q`` (n, d) of ``space`` steered by ``{ref: eps}``: ``Q (I + sum_i eps_i W_i)`` (composed by summation).

    ``load_steer(ref) -> (SteerInfo, Steer | MeanShift)`` (a face's cache). Returns the steered
    queries and the versions used (``[{"name", "version", "eps"}]``); a steer of another space
    is an InputError. No steers: ``Q`` unchanged.
    """
    if not steers:
        return Q, []
    pairs, used = [], []
    for ref, eps in steers.items():
        info, steer = load_steer(ref)
        if info.space != space:
            raise InputError(f"steer {info.ref} lives in space {info.space!r}, but the index's space is {space!r}")
        pairs.append((steer, float(eps)))
        used.append({"name": info.name, "version": info.version, "eps": float(eps)})
    return apply_steer_job(Q, pairs), used
