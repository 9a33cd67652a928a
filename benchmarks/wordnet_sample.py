"""The shared WordNet embedding set, or a small sample of it embedded here when it is absent.

The shared set (``../shared/data/wordnet``, or ``$VECBRIDGE_WORDNET_DIR``) holds 40,960 WordNet
definitions (``texts.json``) and their embeddings by four encoders (``<name>.npy``, float16 unit
rows, row i embeds ``texts[i]``; e5 in its ``passage:`` form). Benchmarks and tests read it when it
is there. When it is not, ``wordnet_dir()`` builds the same layout for a sample of ``rows``
definitions, embedded here by the real encoders (installed from PyPI wheels):

* texts: the distinct definitions of at least 4 words of Debian's ``wordnet-base``
  (``/usr/share/wordnet/data.{noun,verb,adj,adv}``, the gloss before its first ``; "``), in file
  order, shuffled with ``numpy.random.default_rng(seed)``, the first ``rows`` of them — the shared
  set's recipe (DATA.md), so both hold the same kind of text, though not the same rows;
* embeddings: ``minilm`` (all-MiniLM-L6-v2) and ``e5`` (multilingual-e5-small, passage form); the
  shared set's ``paraphrase_l3`` and ``glove`` have no encoder here, so a sample lacks them.

A sample folder also holds ``sample.json`` (rows, seed, encoders, source), so callers can tell it
from the shared set (``is_sample``). It is cached (default ``~/.cache/vecbridge-bench``) and built
under a file lock, so parallel test workers embed it once. About 1 minute for 4,096 rows on two idle
cores (minilm ~190 rows/s, e5 ~70 rows/s).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("VECBRIDGE_WORDNET_DIR", HERE.parents[1] / "shared" / "data" / "wordnet"))
DEBIAN_WORDNET = Path("/usr/share/wordnet")
DEFAULT_CACHE = Path(os.environ.get("VECBRIDGE_BENCH_CACHE", Path.home() / ".cache" / "vecbridge-bench"))
#: rows of the sample built when the shared set is absent
DEFAULT_ROWS = 4096
#: short name -> service encoder name, for the encoders a sample can hold
SAMPLE_ENCODERS = {"minilm": "all-MiniLM-L6-v2", "e5": "multilingual-e5-small"}
SHARED_ROWS = 40960


class SampleUnavailable(RuntimeError):
    """Neither the shared set nor what a sample needs (wordnet-base, the encoders) is here."""


def shared_available(names=("minilm", "e5"), shared: Path | None = None) -> bool:
    """Whether the shared set holds ``texts.json`` and ``<name>.npy`` for every name."""
    folder = SHARED if shared is None else Path(shared)
    return (folder / "texts.json").is_file() and all((folder / f"{n}.npy").is_file() for n in names)


def definitions(wordnet_dir: Path = DEBIAN_WORDNET, min_words: int = 4) -> list[str]:
    """The distinct definitions of at least ``min_words`` words of ``wordnet_dir/data.*``, in file order."""
    sys.path.insert(0, str(HERE))
    try:
        from build_retrieval_sets import wordnet_synsets
    finally:
        sys.path.remove(str(HERE))
    if not (Path(wordnet_dir) / "data.noun").is_file():
        raise SampleUnavailable(f"{wordnet_dir}/data.noun missing: install Debian's wordnet-base "
                                "(apt-get install wordnet-base) or provide the shared WordNet set")
    seen = dict.fromkeys(d for _, _, d in wordnet_synsets(Path(wordnet_dir)) if len(d.split()) >= min_words)
    return list(seen)


def sample_texts(rows: int, seed: int = 0, wordnet_dir: Path = DEBIAN_WORDNET) -> list[str]:
    """``rows`` definitions: the distinct ones shuffled with ``seed``, the first ``rows``."""
    defs = definitions(wordnet_dir)
    if not 1 <= rows <= len(defs):
        raise ValueError(f"rows must be in [1, {len(defs)}], got {rows}")
    order = np.random.default_rng(seed).permutation(len(defs))[:rows]
    return [defs[i] for i in order]


def _atomic_save(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.part-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def _save_npy(path: Path, a: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save would add ".npy" to the temporary name
        np.save(f, a)


def build_sample(folder: Path, rows: int = DEFAULT_ROWS, names=("minilm", "e5"), *, seed: int = 0,
                 wordnet_dir: Path = DEBIAN_WORDNET, log=print) -> Path:
    """Write the shared layout for a sample into ``folder`` (texts.json, <name>.npy, sample.json); cached.

    Each file is written atomically and skipped when present, so an interrupted build resumes; the
    folder is locked while it is built. Returns ``folder``."""
    unknown = [n for n in names if n not in SAMPLE_ENCODERS]
    if unknown:
        raise SampleUnavailable(f"no encoder for {unknown} here (a sample holds {sorted(SAMPLE_ENCODERS)}); "
                                "those embeddings come only with the shared WordNet set")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        meta = {"rows": rows, "seed": seed, "encoders": {n: SAMPLE_ENCODERS[n] for n in names},
                "source": f"{wordnet_dir}/data.{{noun,verb,adj,adv}}: distinct definitions of >= 4 words, "
                          f"shuffled with numpy.random.default_rng({seed}), the first {rows}"}
        texts_path = folder / "texts.json"
        if texts_path.is_file():
            texts = json.loads(texts_path.read_text())
        else:
            texts = sample_texts(rows, seed, wordnet_dir)
            _atomic_save(texts_path, lambda p: p.write_text(json.dumps(texts)))
        if len(texts) != rows:
            raise SampleUnavailable(f"{texts_path} holds {len(texts)} texts, not {rows}: remove {folder}")
        from service.encoders import get_encoder

        for name in names:
            out = folder / f"{name}.npy"
            if out.is_file():
                continue
            enc = get_encoder(SAMPLE_ENCODERS[name])
            log(f"wordnet sample: embedding {rows} definitions with {enc.name} into {out}")
            E = np.vstack([enc.encode(texts[s : s + 256], "passage") for s in range(0, rows, 256)])
            _atomic_save(out, lambda p, E=E: _save_npy(p, E.astype(np.float16)))
        old = json.loads((folder / "sample.json").read_text()) if (folder / "sample.json").is_file() else {}
        meta["encoders"] = {**old.get("encoders", {}), **meta["encoders"]}
        _atomic_save(folder / "sample.json", lambda p: p.write_text(json.dumps(meta, indent=1)))
    return folder


def is_sample(folder: Path) -> bool:
    """Whether ``folder`` is a sample built by ``build_sample`` (not the shared set)."""
    return (Path(folder) / "sample.json").is_file()


def wordnet_dir(names=("minilm", "e5"), *, rows: int = DEFAULT_ROWS, cache: Path | None = None,
                shared: Path | None = None, log=print) -> Path:
    """The shared set's folder when it holds ``names``, else a sample of ``rows`` definitions built here.

    Raises ``SampleUnavailable`` when neither can be had (e.g. ``glove`` without the shared set, or
    no ``wordnet-base``)."""
    if shared_available(names, shared):
        return SHARED if shared is None else Path(shared)
    folder = Path(cache or DEFAULT_CACHE) / f"wordnet-sample-{rows}"
    log(f"shared WordNet set not found at {SHARED if shared is None else shared}: using a sample of {rows} "
        f"definitions embedded here ({folder})")
    return build_sample(folder, rows, names, log=log)


def load(folder: Path, name: str) -> np.ndarray:
    """``<folder>/<name>.npy`` as float32 (rows, d)."""
    return np.asarray(np.load(Path(folder) / f"{name}.npy", mmap_mode="r"), dtype=np.float32)


def rows_of(folder: Path) -> int:
    """How many rows ``folder`` holds (40,960 for the shared set, ``rows`` for a sample)."""
    return len(json.loads((Path(folder) / "texts.json").read_text()))


def split(n: int) -> tuple[slice, slice, slice]:
    """ALGORITHMS.md §4 split of ``n`` rows: unpaired source rows, unpaired target rows, held-out pairs.

    The fractions 0.4 / 0.4 / 0.2 of ``n``: [0, 16384), [16384, 32768), [32768, 40960) for the shared set."""
    a = round(0.4 * n)
    return slice(0, a), slice(a, 2 * a), slice(2 * a, n)


def sample_note(rows: int) -> str:
    """The line a benchmark prints beside figures made on a sample of ``rows`` definitions."""
    return (f"data: a sample of {rows:,} WordNet definitions embedded here (shared set absent); "
            "figures are not comparable with the committed tables")


def note(folder: Path) -> str:
    """The line a benchmark prints beside its table when ``folder`` is a sample (empty for the shared set)."""
    return sample_note(rows_of(folder)) if is_sample(folder) else ""


def tile(a: np.ndarray, rows: int) -> np.ndarray:
    """``a``'s rows repeated to at least ``rows`` (timing batches larger than a sample's held-out rows)."""
    a = np.asarray(a)
    return a if a.shape[0] >= rows else np.ascontiguousarray(np.resize(a, (rows, *a.shape[1:])))
