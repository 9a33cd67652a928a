"""The references a fit request's rows check reads (:func:`service.spaces.space_references`) scale with the maps.

QA (session 56): POST /v1/fits with 113 registered minilm -> e5 maps spent 0.2 s of the request in the agreement
check of the references (each against every other of its space and the other space: 50,850 cosines, one Python call
each); 1,000 maps would make it ~17 s per fit request, and per cache miss of the other routes' checks. The check
compares each reference's mean with the others in one matrix product now, so it reads each mean once.
"""

from __future__ import annotations

import numpy as np

from service.spaces import space_references


class _Frame:
    """A map side's frame: its width and training mean; counts the reads of ``mean``."""

    n_fit = 0
    reads = 0

    def __init__(self, mean: np.ndarray):
        self.dim = mean.shape[0]
        self._mean = mean.astype(np.float32)

    @property
    def mean(self):
        _Frame.reads += 1
        return self._mean


class _Map:
    def __init__(self, source: np.ndarray, target: np.ndarray):
        self.source_frame, self.target_frame = _Frame(source), _Frame(target)


class _Registry:
    """``maps`` minilm -> e5 maps (means near MiniLM's and e5's directions) and one, ``bad``, fitted on e5 rows
    declared minilm: what :func:`space_references` reads of a registry."""

    def __init__(self, maps: int, rng):
        d = 32
        self.minilm, self.e5 = rng.standard_normal(d), rng.standard_normal(d)
        self.maps = {f"m{i:03d}": _Map(self.minilm + 0.1 * rng.standard_normal(d),
                                       self.e5 + 0.1 * rng.standard_normal(d)) for i in range(maps)}
        self.maps["bad"] = _Map(self.e5 + 0.1 * rng.standard_normal(d), self.e5 + 0.1 * rng.standard_normal(d))

    def list_spaces(self):
        return []

    def list_maps(self):
        return [{"name": name, "path_version": 1, "created_at": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}",
                 "source_space": "minilm", "target_space": "e5", "source_dim": 32, "target_dim": 32}
                for i, name in enumerate(self.maps)]

    def load_map(self, ref: str):
        return self.maps[ref.split(":")[0]]


def test_the_references_agreement_check_reads_each_mean_a_bounded_number_of_times():
    reg = _Registry(60, np.random.default_rng(0))
    _Frame.reads = 0
    refs = space_references(reg, 32)
    frames = 2 * len(reg.maps)
    assert _Frame.reads <= 4 * frames, (_Frame.reads, frames)  # was ~4 reads per pair of references: 59,292 here
    # the rule is unchanged: the map fitted on e5 rows under 'minilm' is no reference of minilm; the rest are
    assert [r.what for r in refs["minilm"]] == [f"map m{i:03d}:1's source side" for i in range(60)]
    assert len(refs["e5"]) == 61


def test_references_of_another_width_are_not_compared():
    """Two widths asked for in one call (a fit's two sides): a reference is compared only with those of its width, and
    a space's lone reference is kept."""
    rng = np.random.default_rng(1)
    reg = _Registry(3, rng)
    reg.maps["wide"] = _Map(np.concatenate([reg.e5, reg.e5]), np.concatenate([reg.e5, reg.e5]))
    listed = reg.list_maps()

    def list_maps():
        return [{**m, "source_space": "glove", "source_dim": 64, "target_space": "other", "target_dim": 64}
                if m["name"] == "wide" else m for m in listed]
    reg.list_maps = list_maps
    refs = space_references(reg, {32, 64})
    assert [r.what for r in refs["glove"]] == ["map wide:1's source side"]
    assert [r.what for r in refs["other"]] == ["map wide:1's target side"]
    assert len(refs["minilm"]) == 3 and len(refs["e5"]) == 4
