"""WordNet reverse-dictionary queries for some rows of a corpus of WordNet definitions: the labelled queries of the
README's migration walk-through (and of ``build_retrieval_sets.py``'s ``wordnet`` set, whose recipe this is).

A query is a synset's lemma words (``"domestic dog, Canis familiaris"``; Debian's ``wordnet-base``,
``/usr/share/wordnet/data.{noun,verb,adj,adv}``), its relevant document its definition (the gloss before its first
``; "``). Only synsets whose definition is one of the selected rows of TEXTS (a .json list of definitions: the shared
set's ``texts.json``, or the sample the tests embed) are kept; a definition shared by several synsets is relevant to
each of their queries. Usage (from the repository root)::

    python benchmarks/reverse_dictionary.py TEXTS --rows -1000: --queries queries.txt --relevant relevant.npy \\
        [--max-queries 500] [--seed 0] [--wordnet-dir /usr/share/wordnet]

writes ``queries.txt`` (one query per line, for ``vecbridge embed --kind query``) and ``relevant.npy`` (int64: each
query's row among the selected rows, what ``vecbridge eval --relevant`` reads with ``--rows`` of the same range).
``--max-queries``: a sample of that many (``numpy.random.default_rng(seed)``), in the synsets' file order.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from build_retrieval_sets import WORDNET_DIR, wordnet_synsets


def selected(spec: str, n: int) -> range:
    """Rows ``START:STOP`` (either may be empty, negatives count from the end) of ``n``, as Python slices them."""
    parts = spec.split(":")
    if len(parts) != 2:
        raise SystemExit(f"reverse_dictionary: --rows must look like START:STOP, got {spec!r}")
    picked = range(n)[slice(*(int(p) if p.strip() else None for p in parts))]
    if not picked:
        raise SystemExit(f"reverse_dictionary: --rows {spec} selects none of the {n} texts")
    return picked


def reverse_dictionary(texts: list[str], rows: range, *, max_queries: int | None = None, seed: int = 0,
                       wordnet_dir: Path = WORDNET_DIR) -> tuple[list[str], np.ndarray]:
    """``(queries, relevant)``: the lemma words of each synset whose definition is one of ``texts[rows]``, and the
    position of that definition among ``rows``; at most ``max_queries`` of them (a seeded sample, in file order)."""
    if not (Path(wordnet_dir) / "data.noun").is_file():
        raise SystemExit(f"reverse_dictionary: {wordnet_dir}/data.noun missing: install Debian's wordnet-base")
    where = {texts[r]: i for i, r in enumerate(rows)}
    found = [(", ".join(lemmas), where[d]) for _, lemmas, d in wordnet_synsets(Path(wordnet_dir)) if d in where]
    if max_queries is not None and len(found) > max_queries:
        pick = np.sort(np.random.default_rng(seed).choice(len(found), size=max_queries, replace=False))
        found = [found[i] for i in pick]
    return [q for q, _ in found], np.asarray([i for _, i in found], dtype=np.int64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("texts", type=Path, help="a .json list of WordNet definitions (texts.json)")
    ap.add_argument("--rows", default=":", help="START:STOP rows of TEXTS whose synsets give the queries")
    ap.add_argument("--queries", type=Path, required=True, help="write the queries here, one per line")
    ap.add_argument("--relevant", type=Path, required=True, help="write each query's row among --rows here (.npy)")
    ap.add_argument("--max-queries", type=int, default=None, help="at most this many (a seeded sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wordnet-dir", type=Path, default=WORDNET_DIR)
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv[:-1]):  # `--rows -1000:` as vecbridge takes it (argparse reads -1000: as an option)
        if arg == "--rows":
            argv[i : i + 2] = [f"--rows={argv[i + 1]}"]
            break
    a = ap.parse_args(argv)
    texts = json.loads(a.texts.read_text())
    rows = selected(a.rows, len(texts))
    queries, relevant = reverse_dictionary(texts, rows, max_queries=a.max_queries, seed=a.seed,
                                           wordnet_dir=a.wordnet_dir)
    if not queries:
        raise SystemExit(f"reverse_dictionary: no WordNet synset's definition is among rows {a.rows} of {a.texts}")
    a.queries.write_text("".join(q + "\n" for q in queries))
    np.save(a.relevant, relevant)
    print(f"wrote {len(queries)} queries over {len(rows)} documents (rows {a.rows} of {a.texts.name}) to "
          f"{a.queries} and their relevant rows to {a.relevant}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
