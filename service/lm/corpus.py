"""Human-labelled sentiment sentences available offline: the VADER ground-truth sets.

The source distribution of ``vaderSentiment`` on PyPI ships ``additional_resources/
hutto_ICWSM_2014.tar.gz`` (Hutto & Gilbert, ICWSM 2014): movie-review snippets (10,605),
Amazon review snippets (3,708), tweets (4,200) and NYT editorial snippets (5,190), each with the
**mean rating of about 20 human raters** on [-4, 4]. Those ratings — not VADER's algorithm — are
the labels used here, so a steer trained on them can be scored with VADER (or AFINN) without
grading its own homework.

:func:`fetch_vader_sdist` obtains the archive with the ordinary PyPI client
(``pip download --no-binary :all: --no-deps vaderSentiment==3.3.2``) into a cache folder;
:func:`sentiment_sentences` reads it.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from align.exceptions import InputError

from .model import LMUnavailableError

__all__ = ["fetch_vader_sdist", "sentiment_sentences", "VADER_SDIST"]

VADER_SDIST = "vaderSentiment==3.3.2"
SOURCES = ("movieReviewSnippets", "amazonReviewSnippets", "tweets", "nytEditorialSnippets")


def fetch_vader_sdist(cache: str | Path) -> Path:
    """Path of the ``hutto_ICWSM_2014`` folder under ``cache`` (downloaded and unpacked on first use)."""
    cache = Path(cache)
    folder = cache / "hutto_ICWSM_2014"
    if (folder / "movieReviewSnippets_GroundTruth.txt").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    sdists = sorted(cache.glob("vaderSentiment-*.tar.gz"))
    if not sdists:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
               VADER_SDIST, "-d", str(cache), "-q"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sdists = sorted(cache.glob("vaderSentiment-*.tar.gz"))
        if not sdists:
            raise LMUnavailableError(f"could not fetch the {VADER_SDIST} source distribution: "
                                     f"{(done.stderr or done.stdout).strip()[-300:]}")
    with tarfile.open(sdists[-1]) as outer:
        member = next((m for m in outer.getmembers() if m.name.endswith("hutto_ICWSM_2014.tar.gz")), None)
        if member is None:
            raise LMUnavailableError(f"{sdists[-1].name} has no hutto_ICWSM_2014.tar.gz")
        inner = outer.extractfile(member)
        with tarfile.open(fileobj=inner) as tf:
            for m in tf.getmembers():
                if m.isfile() and m.name.endswith("_GroundTruth.txt") and "/" in m.name and ".." not in m.name:
                    m.name = "hutto_ICWSM_2014/" + m.name.rsplit("/", 1)[1]
                    tf.extract(m, cache, filter="data")
    return folder


def sentiment_sentences(folder: str | Path, *, threshold: float = 1.0, sources=SOURCES, min_words: int = 4,
                        max_words: int = 40) -> tuple[list[str], list[int], list[float]]:
    """``(texts, labels, ratings)``: sentences whose mean human rating is ``>= threshold`` (label +1) or
    ``<= -threshold`` (label -1), from the given ground-truth sets, in file order.

    Sentences shorter than ``min_words`` or longer than ``max_words`` words are left out.
    """
    folder = Path(folder)
    if threshold <= 0:
        raise InputError("threshold must be > 0")
    texts, labels, ratings = [], [], []
    for src in sources:
        path = folder / f"{src}_GroundTruth.txt"
        if not path.is_file():
            raise InputError(f"no ground-truth file {path}")
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) < 3:
                continue
            try:
                r = float(parts[1])
            except ValueError:
                continue
            text = " ".join(parts[2].replace("''", '"').split())
            if not min_words <= len(text.split()) <= max_words or abs(r) < threshold:
                continue
            texts.append(text)
            labels.append(1 if r > 0 else -1)
            ratings.append(r)
    return texts, labels, ratings
