"""A demo registered on an empty data directory, so ``/docs`` is usable at once.

What it does (as a background job; ``/readyz`` reports its state under ``checks.demo``):

1. Takes ``n_texts`` short texts: WordNet definitions from the Debian package ``wordnet-base``
   when installed, else the shared benchmark set ``../shared/data/wordnet/texts.json`` when
   present, else a generated corpus (seeded combinations of bundled word lists).
2. Embeds them with two real encoders: ``all-MiniLM-L6-v2`` (space ``minilm``) and
   ``multilingual-e5-small`` (space ``e5``), registering both spaces.
3. Aligns ``minilm -> e5`` **unsupervised** (mini-vec2vec on the two sets in independent
   random orders: no pairing is used), registers it as ``demo-minilm-e5`` and measures it on
   the known pairs (``top1`` tag). Small samples are hard for unsupervised alignment; when the
   check fails (top-1 < 0.5) a second version is fitted **seeded** with ``n_seed`` known pairs
   and gets the ``prod`` alias, so the demo search works; both versions keep their honest
   metrics and descriptions.
4. Builds the FAISS index ``demo-e5`` of the e5 vectors with each text as payload, so
   ``POST /v1/indexes/demo-e5/search {"texts": ["..."], "space": "minilm"}`` is a cross-model
   search out of the box.

Skip it with ``Settings.demo_on_empty=False`` (``VECBRIDGE_DEMO_ON_EMPTY=false``); tests do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import numpy as np

from .logging import get_logger

__all__ = ["maybe_start_demo", "run_demo", "load_corpus", "generated_corpus", "DEMO_MAP", "DEMO_INDEX",
           "DEMO_PARAMS"]

_log = get_logger("demo")

DEMO_MAP = "demo-minilm-e5"
DEMO_INDEX = "demo-e5"
SOURCE = ("minilm", "all-MiniLM-L6-v2")
TARGET = ("e5", "multilingual-e5-small")
#: mini-vec2vec settings sized for a ~1-minute fit on 2 cores.
DEMO_PARAMS = {"n_anchor_runs": 8, "qap_restarts": 8, "refine1_iters": 30, "self_learning_rounds": 5}
_WORDNET_DIR = Path("/usr/share/wordnet")
_SHARED_TEXTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "wordnet" / "texts.json"

_ADJ = ["small", "old", "bright", "quiet", "heavy", "ancient", "modern", "wooden", "frozen", "busy", "narrow",
        "distant", "tiny", "famous", "broken", "gentle", "noisy", "empty", "golden", "hidden"]
_NOUN = ["dog", "river", "teacher", "train", "garden", "violin", "storm", "library", "mountain", "baker",
         "bridge", "computer", "forest", "market", "ship", "castle", "child", "painter", "engine", "island"]
_VERB = ["crosses", "watches", "carries", "repairs", "follows", "paints", "visits", "guards", "builds", "sells",
         "remembers", "describes", "finds", "cleans", "studies"]
_OBJ = ["a letter", "the old road", "fresh bread", "a red kite", "the village", "a broken clock", "the evening sky",
        "a map of the coast", "the winter harvest", "a quiet song", "the stone wall", "a basket of apples",
        "the last train", "a silver coin", "the harbour lights"]
_WHERE = ["at dawn", "in the rain", "near the sea", "after school", "during the festival", "in the mountains",
          "before dinner", "under the bridge", "on a cold morning", "in the city centre"]


def generated_corpus(n: int, random_state: int = 0) -> list[str]:
    """``n`` distinct sentences from seeded combinations of the bundled word lists."""
    rng = np.random.default_rng(random_state)
    out: dict[str, None] = {}
    while len(out) < n:
        s = (f"The {_ADJ[rng.integers(len(_ADJ))]} {_NOUN[rng.integers(len(_NOUN))]} "
             f"{_VERB[rng.integers(len(_VERB))]} {_OBJ[rng.integers(len(_OBJ))]} {_WHERE[rng.integers(len(_WHERE))]}.")
        out[s] = None
    return list(out)


def _wordnet_definitions(folder: Path) -> list[str]:
    defs: dict[str, None] = {}
    for part in ("noun", "verb", "adj", "adv"):
        p = folder / f"data.{part}"
        if not p.exists():
            continue
        with open(p, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("  ") or " | " not in line:
                    continue  # licence header
                gloss = line.split(" | ", 1)[1].strip()
                d = re.split(r';\s*"', gloss, maxsplit=1)[0].strip().rstrip(";").strip()
                if len(d.split()) >= 4:
                    defs[d] = None
    return list(defs)


def load_corpus(n: int, random_state: int = 0) -> tuple[list[str], str]:
    """``n`` texts and where they came from (wordnet-base, shared texts.json, or generated)."""
    rng = np.random.default_rng(random_state)
    texts = _wordnet_definitions(_WORDNET_DIR) if _WORDNET_DIR.exists() else []
    source = "wordnet-base"
    if len(texts) < n and _SHARED_TEXTS.exists():
        texts = json.loads(_SHARED_TEXTS.read_text())
        source = "shared texts.json"
    if len(texts) < n:
        return generated_corpus(n, random_state), "generated"
    idx = np.sort(rng.choice(len(texts), n, replace=False))
    return [texts[i] for i in idx], source


def _embed(enc, texts: list[str], progress: Callable[[str, float], None], stage: str, batch: int = 128) -> np.ndarray:
    parts = []
    for s in range(0, len(texts), batch):
        progress(stage, s / len(texts))
        parts.append(np.asarray(enc.encode(texts[s : s + batch], kind="passage"), dtype=np.float32))
    progress(stage, 1.0)
    return np.vstack(parts)


def _top1(map_, X: np.ndarray, Y: np.ndarray) -> float:
    from align import evaluate

    return float(evaluate(map_, X, Y, ks=(1,), csls=False)["top1"])


def run_demo(state, progress: Callable[[str, float], None] = lambda s, f: None, *, n_texts: int = 1500,
             n_seed: int = 64, random_state: int = 0, params: dict | None = None) -> dict:
    """Register the demo spaces, map(s) and index in ``state`` (an :class:`service.api.state.AppState`)."""
    from .fitting import run_fit
    from .registry import NotFoundError

    reg = state.registry
    texts, origin = load_corpus(n_texts, random_state)
    progress("load encoders", 0.0)
    enc_s, enc_t = state.encoder(SOURCE[1]), state.encoder(TARGET[1])
    Xs = _embed(enc_s, texts, progress, f"embed {SOURCE[0]}")
    Xt = _embed(enc_t, texts, progress, f"embed {TARGET[0]}")
    for (space, enc_name), enc in ((SOURCE, enc_s), (TARGET, enc_t)):
        try:
            reg.get_space(space)
        except NotFoundError:
            reg.register_space(space, enc.dim, encoder=enc_name, description=f"demo: {enc_name}")
    rng = np.random.default_rng(random_state)
    ps, pt = rng.permutation(len(texts)), rng.permutation(len(texts))  # independent orders: no pairing
    params = dict(DEMO_PARAMS if params is None else params)
    inputs = {"corpus": origin, "n_texts": len(texts)}
    v = run_fit(reg, name=DEMO_MAP, source=Xs[ps], target=Xt[pt], method="minivec2vec", params=params,
                source_space=SOURCE[0], target_space=TARGET[0], paired=False, random_state=random_state,
                alias="prod", progress=progress, inputs=inputs,
                description=f"demo: unsupervised mini-vec2vec on {len(texts)} {origin} texts in independent orders")
    top1 = _top1(reg.load_map(v), Xs, Xt)
    reg.set_tag(DEMO_MAP, v.version, "demo_top1", round(top1, 4))
    result = {"corpus": origin, "n_texts": len(texts), "unsupervised": {"version": v.version, "top1": top1}}
    if top1 < 0.5 and n_seed > 0:
        seeds = rng.choice(len(texts), min(n_seed, len(texts)), replace=False)
        inv_s, inv_t = np.argsort(ps), np.argsort(pt)
        v2 = run_fit(reg, name=DEMO_MAP, source=Xs[ps], target=Xt[pt], method="minivec2vec", params=params,
                     source_space=SOURCE[0], target_space=TARGET[0], paired=False, random_state=random_state,
                     seed_pairs=(inv_s[seeds], inv_t[seeds]), alias="prod", progress=progress, inputs=inputs,
                     description=f"demo: mini-vec2vec seeded with {len(seeds)} known pairs (the unsupervised "
                                 f"version {v.version} reached top-1 {top1:.3f} on this small sample)")
        top1_2 = _top1(reg.load_map(v2), Xs, Xt)
        reg.set_tag(DEMO_MAP, v2.version, "demo_top1", round(top1_2, 4))
        result["seeded"] = {"version": v2.version, "top1": top1_2, "n_seed": int(len(seeds))}
    progress("index", 0.0)
    idx = state.indexes.create(DEMO_INDEX, TARGET[0], Xt, payloads=[{"text": t} for t in texts],
                               description=f"demo: {len(texts)} {origin} texts embedded by {TARGET[1]}")
    state.metrics.index_vectors.labels(idx.name).set(idx.count)
    _log.info("demo registered", extra={"fields": result})
    return result


def maybe_start_demo(state) -> str | None:
    """Queue the demo job when the registry has no maps and there are no indexes; returns the job id."""
    try:
        if state.registry.list_maps() or state.indexes.list():
            return None
        from .encoders import list_encoders

        installed = {e["name"] for e in list_encoders() if e.get("installed")}
        if not {SOURCE[1], TARGET[1]} <= installed:
            _log.warning("demo skipped: encoders not installed", extra={"fields": {"installed": sorted(installed)}})
            return None
    except Exception as exc:  # noqa: BLE001 - the demo must never stop the service
        _log.warning("demo skipped", extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})
        return None
    job, _ = state.jobs.submit(lambda ctx: run_demo(state, ctx.progress), kind="demo",
                               description="register the demo spaces, map and index")
    return job.id
