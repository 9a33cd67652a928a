"""Build the labelled retrieval sets of the migration benchmark, offline, and cache them outside git.

Two sets, each a corpus of documents, a list of queries with ONE relevant document each, a pool
of rows from which fit pairs are drawn, and per-encoder embeddings:

``wordnet`` — reverse dictionary from Debian's ``wordnet-base`` (``/usr/share/wordnet/data.*``).
    query = a synset's lemma words (underscores → spaces, adjective markers such as ``(a)``
    dropped), e.g. ``"domestic dog, Canis familiaris"``; relevant document = its gloss (the text
    before the first ``; "``). Corpus = the 40,960 definitions of the shared set
    ``shared/data/wordnet/texts.json``, whose MiniLM and e5 (``passage:``) embeddings are reused
    (without the shared set: the texts and embeddings of ``wordnet_sample.py``'s sample of
    ``--sample-rows`` definitions, every split below scaled to its n rows: pool = the first 80 %,
    held-out = the rest, mpnet = the first 10 % and the held-out; ``set.json`` records the corpus);
    a definition shared by several synsets is relevant to each of their queries. Split: fit pairs
    come from corpus rows [0, 32768); evaluation queries are synsets whose gloss is in the
    held-out rows [32768, 40960) (seeded sample of ``--wordnet-queries``); retrieval always runs
    over all 40,960 glosses. all-mpnet-base-v2 is slow here (21-23 sentences/s on the 2 cores
    when they are quiet, ~1/s under heavy load), so it embeds only rows [0, 4096) (its fit pool)
    and the held-out [32768, 40960): its corpus is those 12,288 rows (~10 min), its queries all
    the evaluation queries. (Caches built before 2026-12-01 hold rows [0, 1280) and
    [32768, 34304); the rows always come from the cached ``set.json``, so they stay consistent.)

``wordnet-small`` — the same task on the first 1,280 definitions (fit pool: the first 768; queries:
    all 514 synsets whose gloss is in the other 512), for all-mpnet-base-v2, which under the
    shared machine's load (nice 10) could not embed the held-out part of ``wordnet`` in time.

``bible`` — cross-translation from ``sword-text-web`` / ``sword-text-kjv`` through ``diatheke``:
    query = a World English Bible verse, relevant document = the same verse in the King James
    Version. Embedding all 31k verses with three encoders is far too slow on 2 shared cores, so a
    seeded sample of ``--bible-verses`` verses (default 3,000) forms the corpus: the first half
    of the sample is the fit pool, ``--bible-queries`` (default 600) WEB verses from the
    second half are the evaluation queries. e5, slower still, embeds 500 pool verses and the first
    1,000 held-out ones (its queries: those whose verse is among them). mpnet (the second encoder
    pair, whose goal is read at K = 1,000) embeds every verse, so its fit pool holds 1,500 rows; a
    cache made before 2026-12-01 (session 10) that lists it on the e5 rows takes all rows while it has no mpnet
    vectors yet.

Layout under the cache folder (``--cache``, default ``$VECBRIDGE_BENCH_CACHE`` or ``~/.cache/vecbridge-bench``)::

    <set>/set.json                docs, queries, query_doc, fit_pool, encoder rows, provenance
    <set>/<encoder>_docs.npy      float16 unit rows for set.json["rows"][<encoder>] (doc indices)
    <set>/<encoder>_queries.npy   float16 unit rows, one per query (query-form for e5)
    <set>/parts/…                 resumable chunks while embedding

Every step is cached: a rerun only embeds what is missing. Usage::

    nice -n 10 python benchmarks/build_retrieval_sets.py                       # both sets, minilm + e5
    nice -n 10 python benchmarks/build_retrieval_sets.py --encoders mpnet      # the second pair
    python benchmarks/build_retrieval_sets.py --sets wordnet --no-embed        # texts only
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "2")

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import wordnet_sample

HERE = Path(__file__).resolve().parent
DEFAULT_CACHE = wordnet_sample.DEFAULT_CACHE  # $VECBRIDGE_BENCH_CACHE, else ~/.cache/vecbridge-bench
WORDNET_DIR = Path("/usr/share/wordnet")
SMALL_ROWS, SMALL_POOL = 1280, 768  # wordnet-small: corpus rows [0, 1280), fit pool [0, 768)
#: encoder short name -> (service encoder name, whether queries use a query form)
ENCODERS = {"minilm": "all-MiniLM-L6-v2", "e5": "multilingual-e5-small", "mpnet": "all-mpnet-base-v2"}
SHARED_EMBEDDINGS = {"minilm": "minilm.npy", "e5": "e5.npy"}
CHUNK = 256


# --- WordNet --------------------------------------------------------------------------------------

_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")


def parse_wordnet_line(line: str) -> tuple[str, str, list[str], str] | None:
    """One ``data.*`` line → ``(offset, ss_type, lemmas, definition)``, or None for header lines.

    Format: ``offset lex_filenum ss_type w_cnt(hex) word lex_id [word lex_id ...] p_cnt ... | gloss``;
    lemmas get spaces for underscores and lose adjective markers (``(a)``, ``(p)``, ``(ip)``);
    the definition is the gloss before the first ``; "`` (quoted examples follow it).
    """
    if not line or line.startswith(" ") or " | " not in line:
        return None
    head, gloss = line.rstrip("\n").split(" | ", 1)
    f = head.split()
    offset, ss_type, w_cnt = f[0], f[2], int(f[3], 16)
    lemmas = []
    for i in range(w_cnt):
        word = _ADJ_MARKER.sub("", f[4 + 2 * i])
        word = word.replace("_", " ")
        if word not in lemmas:
            lemmas.append(word)
    definition = gloss.split('; "', 1)[0].strip()
    return offset, ss_type, lemmas, definition


def wordnet_synsets(wordnet_dir: Path = WORDNET_DIR) -> list[tuple[str, list[str], str]]:
    """All synsets ``(id "pos:offset", lemmas, definition)`` of ``data.{noun,verb,adj,adv}``."""
    out = []
    for pos in ("noun", "verb", "adj", "adv"):
        with open(wordnet_dir / f"data.{pos}", encoding="utf-8", errors="replace") as f:
            for line in f:
                rec = parse_wordnet_line(line)
                if rec is not None:
                    out.append((f"{rec[1]}:{rec[0]}", rec[2], rec[3]))
    return out


def wordnet_rows(n: int, small: bool = False) -> dict:
    """Rows of the ``wordnet`` set over a corpus of ``n`` definitions (the shared set: 40,960): ``corpus`` (the first
    rows used), ``pool`` = the first 80 % (``wordnet_sample.split``'s unpaired rows), ``heldout`` = the rest,
    ``mpnet`` = the first 10 % and the held-out; ``small``: the first ``SMALL_ROWS`` (at most ``n``), pool 60 %."""
    if small:
        rows = min(SMALL_ROWS, n)
        pool = SMALL_POOL if rows == SMALL_ROWS else rows * 3 // 5
        return {"corpus": rows, "pool": pool, "heldout": (pool, rows), "mpnet": ((0, rows),)}
    pool = wordnet_sample.split(n)[2].start
    return {"corpus": n, "pool": pool, "heldout": (pool, n), "mpnet": ((0, n // 10), (pool, n))}


def wordnet_corpus(folder: Path) -> dict:
    """``set.json``'s record of the corpus folder ``folder`` (the shared set, or a sample: its path and rows)."""
    if not wordnet_sample.is_sample(folder):
        return {"sample": False, "rows": len(json.loads((Path(folder) / "texts.json").read_text()))}
    return {"sample": True, "dir": str(Path(folder).resolve()),
            "rows": json.loads((Path(folder) / "sample.json").read_text())["rows"]}


def corpus_dir(spec: dict) -> Path:
    """Where a WordNet set's minilm / e5 corpus embeddings are: its sample's folder, or the shared set
    (sets built before ``set.json`` recorded a ``corpus``: the shared set)."""
    corpus = spec.get("corpus") or {}
    return Path(corpus["dir"]) if corpus.get("sample") else wordnet_sample.SHARED


def corpus_note(spec: dict) -> str:
    """``wordnet_sample.sample_note`` when the set's corpus is a sample, else ``""``."""
    corpus = spec.get("corpus") or {}
    return wordnet_sample.sample_note(corpus["rows"]) if corpus.get("sample") else ""


def build_wordnet(n_queries: int, seed: int = 0, *, small: bool = False,
                  sample_rows: int = wordnet_sample.DEFAULT_ROWS) -> dict:
    """The reverse-dictionary set over the shared 40,960 definitions, or over a sample of ``sample_rows`` when the
    shared set is absent (see module docstring).

    ``small=True`` builds ``wordnet-small``: corpus = the first ``SMALL_ROWS`` definitions, fit
    pool = the first ``SMALL_POOL`` of them, queries = every synset whose gloss is in the rest."""
    folder = wordnet_sample.wordnet_dir(tuple(SHARED_EMBEDDINGS), rows=sample_rows)
    docs = json.loads((folder / "texts.json").read_text())
    corpus = wordnet_corpus(folder)
    split = wordnet_rows(len(docs), small)
    docs = docs[: split["corpus"]]
    where = {t: i for i, t in enumerate(docs)}
    synsets = wordnet_synsets()
    lo, hi = split["heldout"]
    held = [(sid, ", ".join(lemmas), where[d]) for sid, lemmas, d in synsets
            if d in where and lo <= where[d] < hi]
    matched = sum(1 for _, _, d in synsets if d in where)
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(held), size=min(n_queries, len(held)), replace=False))
    queries = [held[i][1] for i in pick]
    query_doc = [int(held[i][2]) for i in pick]
    rows = {"minilm": list(range(len(docs))), "e5": list(range(len(docs))),
            "mpnet": [i for a, b in split["mpnet"] for i in range(a, b)]}
    source = ("shared texts.json" if not corpus["sample"]
              else f"a sample of {corpus['rows']} definitions embedded here ({folder}/texts.json)")
    spec = {"name": "wordnet-small" if small else "wordnet", "docs": docs, "queries": queries, "query_doc": query_doc,
            "query_ids": [held[i][0] for i in pick],
            "fit_pool": list(range(split["pool"])), "rows": rows,
            "provenance": {"synsets": len(synsets), "synsets_matched_to_corpus": matched,
                           "heldout_synsets": len(held), "seed": seed,
                           "source": f"wordnet-base data.{{noun,verb,adj,adv}}; corpus = {source}"}}
    if corpus["sample"]:  # the shared set's specs stay as they were: no "corpus" means the shared set
        spec["corpus"] = corpus
    return spec


# --- Bible -------------------------------------------------------------------------------------------

_VERSE = re.compile(r"^\s*((?:(?:[1-4]|I{1,3}|IV) )?[A-Z][A-Za-z ]*?) (\d+):(\d+): ?(.*)$")


def parse_diatheke(text: str) -> dict[str, str]:
    """``diatheke -f plain`` output → ``{"Book c:v": verse text}``.

    A verse starts with ``Book chapter:verse: ``; following lines (poetry) continue it until the
    next verse (they may start with one space); the closing ``(module)`` line and text indented by
    three spaces or more (the WEB glossary after Revelation) are dropped; whitespace is collapsed.
    """
    verses: dict[str, list[str]] = {}
    key = None
    for line in text.splitlines():
        m = _VERSE.match(line)
        if m:
            key = f"{m.group(1)} {m.group(2)}:{m.group(3)}"
            verses[key] = [m.group(4)]
        elif key is not None and line.strip() and not line.startswith("   ") and not re.fullmatch(r"\(\w+\)", line.strip()):
            verses[key].append(line)
    return {k: " ".join(" ".join(v).split()) for k, v in verses.items()}


def diatheke_module(module: str, key: str = "Gen 1:1-Rev 22:21") -> dict[str, str]:
    out = subprocess.run(["diatheke", "-b", module, "-f", "plain", "-k", key], capture_output=True, text=True,
                         check=True, timeout=300)
    return parse_diatheke(out.stdout)


def _bible_module(prefix: str) -> str:
    out = subprocess.run(["diatheke", "-b", "system", "-k", "modulelist"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    names = [ln.split(" : ")[0].strip() for ln in out.splitlines() if " : " in ln]
    hits = [n for n in names if n.startswith(prefix)]
    if not hits:
        raise SystemExit(f"no SWORD module starting with {prefix!r} (apt-get install sword-text-kjv sword-text-web diatheke)")
    return hits[0]


def build_bible(n_verses: int, n_queries: int, seed: int = 0) -> dict:
    """WEB verse → KJV verse over a seeded sample of ``n_verses`` aligned verses (module docstring)."""
    kjv_mod, web_mod = _bible_module("engKJV"), _bible_module("engWEB")
    kjv, web = diatheke_module(kjv_mod), diatheke_module(web_mod)
    keys = [k for k in kjv if k in web and len(kjv[k].split()) >= 3 and len(web[k].split()) >= 3]
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(keys), size=min(n_verses, len(keys)), replace=False)
    chosen = [keys[i] for i in pick]
    half = len(chosen) // 2
    q_rows = np.sort(rng.choice(np.arange(half, len(chosen)), size=min(n_queries, len(chosen) - half), replace=False))
    docs = [kjv[k] for k in chosen]
    all_rows = list(range(len(docs)))
    # e5 embeds a part: 500 pool verses and the first 1,000 held-out ones; mpnet all (module docstring)
    slow_rows = list(range(min(500, half))) + list(range(half, min(len(docs), half + 1000)))
    return {"name": "bible", "docs": docs, "queries": [web[chosen[i]] for i in q_rows],
            "query_doc": [int(i) for i in q_rows], "query_ids": [chosen[i] for i in q_rows],
            "doc_ids": chosen, "fit_pool": list(range(half)),
            "rows": {"minilm": all_rows, "e5": slow_rows, "mpnet": all_rows},
            "provenance": {"aligned_verses": len(keys), "modules": [web_mod, kjv_mod], "seed": seed,
                           "source": "diatheke -f plain, WEB = queries, KJV = documents"}}


# --- embedding, cached and resumable -----------------------------------------------------------------

def embed_cached(encoder: str, texts: list[str], kind: str, out: Path, parts: Path, *, chunk: int = CHUNK,
                 log=print) -> np.ndarray:
    """Embed ``texts`` with ``encoder`` into ``out`` (float16), chunk by chunk (resumable)."""
    if out.is_file():
        return np.load(out)
    from service.encoders import get_encoder

    enc = get_encoder(ENCODERS[encoder])
    parts.mkdir(parents=True, exist_ok=True)
    t0, done = time.time(), 0
    blocks = []
    for s in range(0, len(texts), chunk):
        p = parts / f"{out.stem}_{s:07d}_{len(texts)}.npy"
        if p.is_file():
            blocks.append(np.load(p))
            continue
        E = enc.encode(texts[s : s + chunk], kind).astype(np.float16)
        np.save(p, E)
        blocks.append(E)
        done += len(E)
        log(f"  {out.stem}: {s + len(E)}/{len(texts)} ({done / (time.time() - t0):.1f}/s)")
    E = np.vstack(blocks) if blocks else np.zeros((0, enc.dim), np.float16)
    tmp = out.with_suffix(".tmp.npy")
    np.save(tmp, E)
    os.replace(tmp, out)
    for s in range(0, len(texts), chunk):
        (parts / f"{out.stem}_{s:07d}_{len(texts)}.npy").unlink(missing_ok=True)
    return E


def load_set(name: str, cache: Path = DEFAULT_CACHE) -> dict:
    """The cached set description (``set.json``)."""
    path = Path(cache) / name / "set.json"
    if not path.is_file():
        raise SystemExit(f"{path} missing: run benchmarks/build_retrieval_sets.py --sets {name}")
    return json.loads(path.read_text())


def query_rows(spec: dict, encoder: str) -> list[int]:
    """Indices into ``spec["queries"]`` that ``encoder`` embeds: those whose document it embedded."""
    have = set(spec["rows"][encoder])
    return [i for i, d in enumerate(spec["query_doc"]) if d in have]


def load_embeddings(name: str, encoder: str, cache: Path = DEFAULT_CACHE):
    """``(doc_rows (m,), docs (m, d), query_rows (q,), queries (q, d))`` float32, or None when not embedded."""
    folder = Path(cache) / name
    spec = load_set(name, cache)
    rows = np.asarray(spec["rows"][encoder], dtype=np.int64)
    qpath = folder / f"{encoder}_queries.npy"
    if name.startswith("wordnet") and encoder in SHARED_EMBEDDINGS:
        shared = corpus_dir(spec) / SHARED_EMBEDDINGS[encoder]
        if not shared.is_file():  # the set's corpus data is absent: not embedded here, as a missing cache file
            return None
        D = np.load(shared, mmap_mode="r")
        if D.shape[0] != (spec.get("corpus") or {}).get("rows", wordnet_sample.SHARED_ROWS):
            return None  # another corpus than the one the set was built from
        D = D[rows]
    else:
        dpath = folder / f"{encoder}_docs.npy"
        if not dpath.is_file():
            return None
        D = np.load(dpath)
    if not qpath.is_file():
        return None
    return (rows, np.ascontiguousarray(D, dtype=np.float32), np.asarray(query_rows(spec, encoder)),
            np.load(qpath).astype(np.float32))


def _write_spec(path: Path, spec: dict) -> None:
    """``set.json``, atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec))
    os.replace(tmp, path)


def check_corpus(spec: dict, spec_path: Path, sample_rows: int) -> None:
    """Refuse to extend a cached WordNet set whose corpus is not the data there is now (the shared set, or the
    sample ``wordnet_sample.wordnet_dir`` gives): its rows would index another corpus."""
    folder = wordnet_sample.wordnet_dir(tuple(SHARED_EMBEDDINGS), rows=sample_rows)
    now, was = wordnet_corpus(folder), spec.get("corpus") or {"sample": False, "rows": wordnet_sample.SHARED_ROWS}
    if now != was:
        def what(c):
            return f"a sample of {c['rows']} definitions ({c['dir']})" if c["sample"] else "the shared set"

        raise SystemExit(f"{spec_path} was built from {what(was)}, but the WordNet data now is {what(now)}: "
                         "build this set under another --cache (the cached one is left as it is)")


def build(names, encoders, cache: Path, *, embed: bool, wordnet_queries: int, bible_verses: int,
          bible_queries: int, seed: int, sample_rows: int = wordnet_sample.DEFAULT_ROWS) -> None:
    for name in names:
        folder = cache / name
        spec_path = folder / "set.json"
        if spec_path.is_file():
            spec = json.loads(spec_path.read_text())
            if name.startswith("wordnet"):
                check_corpus(spec, spec_path, sample_rows)
        else:
            spec = (build_bible(bible_verses, bible_queries, seed) if name == "bible"
                    else build_wordnet(wordnet_queries, seed, small=name == "wordnet-small", sample_rows=sample_rows))
            folder.mkdir(parents=True, exist_ok=True)
            _write_spec(spec_path, spec)
        if corpus_note(spec):
            print(f"{name}: {corpus_note(spec)}", flush=True)
        print(f"{name}: {len(spec['docs'])} docs, {len(spec['queries'])} queries, fit pool {len(spec['fit_pool'])};"
              f" {spec['provenance']}", flush=True)
        if not embed:
            continue
        if name == "bible" and "mpnet" in encoders and not (folder / "mpnet_docs.npy").is_file():
            spec["rows"]["mpnet"] = list(range(len(spec["docs"])))  # older caches listed the e5 rows
            _write_spec(spec_path, spec)
        for enc in encoders:
            rows = spec["rows"][enc]
            q_keep = [spec["queries"][i] for i in query_rows(spec, enc)]
            if not (name.startswith("wordnet") and enc in SHARED_EMBEDDINGS):
                embed_cached(enc, [spec["docs"][i] for i in rows], "passage", folder / f"{enc}_docs.npy",
                             folder / "parts")
            embed_cached(enc, q_keep, "query", folder / f"{enc}_queries.npy", folder / "parts")
            print(f"{name}/{enc}: embedded", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", nargs="+", default=["wordnet", "bible"], choices=["wordnet", "bible", "wordnet-small"])
    ap.add_argument("--encoders", nargs="+", default=["minilm", "e5"], choices=list(ENCODERS))
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--no-embed", action="store_true", help="build the texts and splits only")
    ap.add_argument("--wordnet-queries", type=int, default=2000)
    ap.add_argument("--bible-verses", type=int, default=3000)
    ap.add_argument("--bible-queries", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-rows", type=int, default=wordnet_sample.DEFAULT_ROWS,
                    help="without the shared WordNet set: definitions in the sample embedded here (wordnet_sample.py)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    try:
        build(a.sets, a.encoders, a.cache, embed=not a.no_embed, wordnet_queries=a.wordnet_queries,
              bible_verses=a.bible_verses, bible_queries=a.bible_queries, seed=a.seed, sample_rows=a.sample_rows)
    except wordnet_sample.SampleUnavailable as exc:
        print(f"no WordNet data: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
