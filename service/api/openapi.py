"""Request bodies in the OpenAPI document: their schema and runnable examples (``/docs`` → "Try it out").

The examples build one small world in order, so a reader can run them top to bottom in
``/docs`` on an empty service (``tests/service/api/test_openapi_examples.py`` does exactly that):

1. ``POST /v1/spaces`` ``toy-a`` (4-d);
2. ``POST /v1/fits`` ``toy-a2b``: paired Procrustes from ``toy-a`` to ``toy-b`` (registered from the
   data), the target being the source with its coordinates swapped pairwise (a rotation);
3. ``PUT /v1/maps/toy-a2b/aliases/prod``, ``PUT /v1/maps/toy-a2b/versions/1/tags/owner``;
4. ``POST /v1/maps/toy-a2b/transform``;
5. ``POST /v1/indexes`` ``toy-b-docs`` in ``toy-b``, ``POST .../vectors``, ``POST .../search`` with
   ``toy-a`` queries (mapped through ``toy-a2b@prod``), ``POST .../delete``;
6. ``POST /v1/steers`` ``toy-up`` in ``toy-b``, ``POST /v1/steers/toy-up/apply``;
7. ``POST /v1/fits`` ``toy-b2a`` (the ``inverse`` example: toy-b back to toy-a), ``POST /v1/steers/toy-up/transfer``
   through it: ``toy-up-a``, the steer carried into toy-a.

The embeddings and LM examples need the encoders / language model installed.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["EXAMPLES", "REF_TEMPLATE", "json_body", "examples"]

#: where a request schema's ``$ref`` point: the document's components
REF_TEMPLATE = "#/components/schemas/{model}"

_A = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0],
      [0.6, 0.8, 0.0, 0.0], [0.0, 0.0, 0.8, 0.6], [0.5, 0.5, 0.5, 0.5], [0.9, 0.0, 0.1, 0.4]]
_B = [[r[1], r[0], r[3], r[2]] for r in _A]  # toy-b = toy-a with coordinates swapped pairwise
# a plan needs a probe of at least 50 pairs (the 8 rows above were a 422): 64 spread toy-a rows and their swaps
_PROBE_A = [[round(math.cos(i), 3), round(math.sin(i), 3), round(math.cos(2.1 * i), 3), round(math.sin(1.7 * i), 3)]
            for i in range(64)]
_PROBE_B = [[r[1], r[0], r[3], r[2]] for r in _PROBE_A]
# a fit from texts embeds them in the job; the same texts on both sides make the pairs (an unsupervised fit needs
# thousands of texts, more than an example can hold: two per side failed with TooFewRowsError)
_TEXTS = ["a cat sits on the mat", "stocks fell sharply", "the weather is mild", "a dog chases a ball",
          "she plays the violin", "the train was late", "rain is expected tomorrow", "he cooks pasta at night"]


def _ex(summary: str, value: Any) -> dict:
    return {"summary": summary, "value": value}


EXAMPLES: dict[str, dict[str, dict]] = {
    "create_space": {
        "toy": _ex("A 4-d space (step 1 of the toy walk-through)", {"name": "toy-a", "dim": 4,
                                                                      "description": "toy source space"}),
        "encoder": _ex("A space produced by an installed encoder (dim taken from it)",
                       {"name": "minilm", "encoder": "all-MiniLM-L6-v2"}),
    },
    "create_fit": {
        "toy": _ex("Paired Procrustes fit toy-a -> toy-b (toy-b is registered from the data)", {
            "name": "toy-a2b", "source_space": "toy-a", "target_space": "toy-b", "method": "procrustes",
            "paired": True, "source": {"vectors": _A}, "target": {"vectors": _B}, "random_state": 0}),
        "inverse": _ex("The inverse fit toy-b -> toy-a (the steer transfer example carries toy-up through it)", {
            "name": "toy-b2a", "source_space": "toy-b", "target_space": "toy-a", "method": "procrustes",
            "paired": True, "source": {"vectors": _B}, "target": {"vectors": _A}, "random_state": 0}),
        "texts": _ex("Paired fit from texts: the same texts, embedded in the job by each space's encoder", {
            "name": "minilm-e5", "source_space": "minilm", "target_space": "e5", "method": "procrustes",
            "paired": True, "source": {"texts": _TEXTS, "encoder": "all-MiniLM-L6-v2"},
            "target": {"texts": _TEXTS, "encoder": "multilingual-e5-small"}}),
    },
    "create_migration": {
        "migrate": _ex("Migrate a collection of the service's vector database through a map, then switch an alias", {
            "source": "docs_minilm", "target": "docs_e5", "map": "minilm-e5@prod", "alias": "docs",
            "batch_size": 2000}),
        "dry_run": _ex("Check first: every refusal a run would make, one batch read and mapped, nothing written", {
            "source": "docs_minilm", "target": "docs_e5", "map": "minilm-e5@prod", "dry_run": True}),
    },
    "create_verification": {
        "rows": _ex("Does the migrated collection hold every source row, mapped?", {
            "collection": "docs", "source": "docs_minilm", "map": "minilm-e5@prod"}),
        "reembed": _ex("Re-embed 500 stored texts with the new model; FAIL below recall@10 0.4", {
            "collection": "docs", "encoder": "multilingual-e5-small", "n_sample": 500, "min_recall": 0.4}),
    },
    "search_collection": {"toy": _ex("New-model queries against a collection still in the old model's space", {
        "vectors": [[0.1, 0.9, 0.0, 0.0]], "space": "toy-b", "k": 3})},
    "create_plan": {"b64": _ex("An old corpus as base64 float32 and a paired probe of 64 rows (toy-a / toy-b)", {
        "old": {"vectors_b64": "AACAPwAAAAAAAAAAAAAAAJqZGT/NzEw/AAAAAAAAAAA=", "dim": 4},
        "probe_source": {"vectors": _PROBE_A}, "probe_target": {"vectors": _PROBE_B}, "target_retention": 0.95,
        "random_state": 0})},
    "evaluate_map": {"labelled": _ex("Held-out pairs and two labelled queries (too few to decide a gate: the answer "
                                     "says why in `undecided`; a `min_retention` gate on it is a 422)", {
        "source": {"vectors": _A}, "target": {"vectors": _B},
        "queries": {"vectors": [[0.1, 0.9, 0.0, 0.0], [0.0, 0.0, 0.2, 0.9]]}, "relevant": [0, 2], "side": "target"})},
    "set_alias": {"prod": _ex("Point `prod` at version 1", {"version": 1})},
    "set_tag": {"owner": _ex("A string (another JSON value is stored as its JSON text)", {"value": "search-team"})},
    "transform": {
        "toy": _ex("Two rows of toy-a as JSON numbers", {"vectors": [[1.0, 0.0, 0.0, 0.0], [0.6, 0.8, 0.0, 0.0]]}),
        "base64": _ex("The same rows as base64 float32 (fast path inside JSON), answered in base64", {
            "vectors_b64": "AACAPwAAAAAAAAAAAAAAAJqZGT/NzEw/AAAAAAAAAAA=", "dim": 4, "encoding_format": "base64"}),
    },
    "create_index": {
        "toy": _ex("An exact index of four toy-b rows with payloads", {
            "name": "toy-b-docs", "space": "toy-b", "vectors": _B[:4], "ids": [1, 2, 3, 4],
            "payloads": [{"title": t} for t in ("one", "two", "three", "four")]}),
        "texts": _ex("Rows as texts, embedded with the space's encoder", {
            "name": "minilm-docs", "space": "minilm", "texts": ["a cat sits on the mat", "stocks fell sharply"]}),
    },
    "add_vectors": {"toy": _ex("Add one row with its id", {"vectors": [_B[6]], "ids": [100],
                                                          "payloads": [{"title": "mixed"}]})},
    "delete_vectors": {"toy": _ex("Delete rows by id", {"ids": [100]})},
    "search": {
        "toy": _ex("Queries from toy-a, mapped into toy-b through the registry's map", {
            "vectors": [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]], "space": "toy-a", "k": 2}),
        "texts": _ex("Text queries in another space, re-ranked by CSLS", {
            "texts": ["a kitten on a rug"], "space": "minilm", "k": 5, "csls": True}),
    },
    "create_steer": {"toy": _ex("A rank-1 steer in toy-b: +1 rows lean on the first coordinate", {
        "name": "toy-up", "space": "toy-b", "vectors": _B, "labels": [-1, 1, -1, -1, 1, -1, 1, -1],
        "random_state": 0})},
    "transfer_steer": {"toy": _ex("Carry the steer toy-up (space toy-b) into toy-a through the map toy-b2a (the "
                                  "`inverse` fit example); registered there with lineage, flagged unreliable as "
                                  "the map is (8 pairs: too few to judge), so prod is not moved to it", {
        "map": "toy-b2a:1", "name": "toy-up-a", "alias": "prod"})},
    "apply_steer": {"toy": _ex("Steer two toy-b rows at half strength", {
        "vectors": [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]], "eps": 0.5})},
    "embeddings": {
        "plain": _ex("OpenAI-shaped", {"input": ["a cat sits on the mat"], "model": "all-MiniLM-L6-v2"}),
        "translated": _ex("Translated into another registered space", {
            "input": "a cat sits on the mat", "model": "all-MiniLM-L6-v2", "target_space": "e5"}),
    },
    "lm_fit": {"polite": _ex("A small style steer on the language model", {
        "name": "polite", "texts": ["Thank you so much, that is very kind.", "Could you please help me?",
                                    "Shut up and do it.", "This is useless, go away."],
        "labels": [1, 1, -1, -1], "rank": 4, "steps": 50})},
    "lm_generate": {"steered": _ex("Continue a prompt under a steer", {
        "prompt": "The meeting today was", "steers": {"polite": 1.0}, "max_new_tokens": 20})},
    "lm_analyze": {"evidence": _ex("Which tokens carry the steer's style", {
        "text": "Thank you, that was very kind of you.", "steer": "polite"})},
}


def examples(route: str) -> dict[str, dict]:
    """The named OpenAPI examples of ``route`` (for ``Body(openapi_examples=...)``)."""
    return EXAMPLES[route]


def json_body(model, route: str | None = None, *, extra_content: dict | None = None) -> dict:
    """``openapi_extra`` for a route that reads its JSON body itself: ``model``'s schema, the
    route's examples, and any other media types (``extra_content``). The schemas it uses (``$defs``) are referred
    to as components: :func:`service.api.document.hoist_defs` moves them there."""
    content = {"application/json": {"schema": model.model_json_schema(ref_template=REF_TEMPLATE),
                                    **({"examples": EXAMPLES[route]} if route else {})}}
    return {"requestBody": {"required": True, "content": {**content, **(extra_content or {})}}}
