"""Opt-in (``pytest -m slow``): the real SmolLM2 behind the HTTP routes, end to end.

Starts the service with uvicorn on loopback, fits a small LM steer over HTTP on human-rated
sentences (the VADER ground truth shipped in the ``vaderSentiment`` source distribution; the
labels are the raters', not VADER's), generates with eps = +3 and -3 (sampling, seeds fixed) and
checks that VADER's mean compound score of the continuations moves the right way.
Several minutes on a 2-core CPU (model load ~30 s, fit, 2 x 8 generations), hence opt-in.
"""

from __future__ import annotations

import os
import sys
import time

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
vader = pytest.importorskip("vaderSentiment.vaderSentiment")

from _api_support import R, W  # noqa: E402
from _servers import start_on_free_port, stop  # noqa: E402
from _servers import env_for  # noqa: E402

PROMPTS = ["The book", "The city", "The movie", "The pizza", "The road", "The lake", "The last time", "The horse"]


@pytest.mark.slow
def test_lm_steer_over_http_moves_the_classifier(request, tmp_path):
    if "slow" not in (request.config.getoption("-m") or "") and not os.environ.get("VECBRIDGE_RUN_SLOW"):
        pytest.skip("opt-in: pytest -m slow")
    from service.lm.corpus import fetch_vader_sdist, sentiment_sentences
    from service.lm.model import LMUnavailableError, smollm2_gguf_path

    try:
        smollm2_gguf_path()
        folder = fetch_vader_sdist(tmp_path / "vader")
    except LMUnavailableError as exc:
        pytest.skip(str(exc))
    texts, labels, _ = sentiment_sentences(folder, threshold=2.0, sources=("movieReviewSnippets",), max_words=25)
    pos = [t for t, y in zip(texts, labels) if y > 0][:60]
    neg = [t for t, y in zip(texts, labels) if y < 0][:60]
    proc, port = start_on_free_port(lambda port: (
        [sys.executable, "-m", "uvicorn", "--factory", "service.api:create_app", "--host", "127.0.0.1",
         "--port", str(port), "--no-access-log"],
        {**env_for(tmp_path / "data", port), "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1",
         "TRANSFORMERS_OFFLINE": "1"}), tmp_path / "server.log")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600.0) as c:
            r = c.post("/v1/lm/steers", headers=W, json={"name": "tone", "texts": pos + neg,
                                                         "labels": [1] * len(pos) + [-1] * len(neg), "rank": 8,
                                                         "steps": 120, "random_state": 0})
            assert r.status_code == 202, r.text
            jid, t0 = r.json()["id"], time.time()
            while True:
                job = c.get(f"/v1/jobs/{jid}", headers=R).json()
                if job["state"] not in ("queued", "running"):
                    break
                assert time.time() - t0 < 1800, "LM steer fit did not finish"
                time.sleep(1.0)
            assert job["state"] == "succeeded", job
            scorer = vader.SentimentIntensityAnalyzer()
            mean = {}
            for eps in (3.0, -3.0):
                scores = []
                for i, p in enumerate(PROMPTS):
                    g = c.post("/v1/lm/generate", headers=R, json={"prompt": p, "steers": {"tone": eps},
                                                                   "max_new_tokens": 16, "random_state": i})
                    assert g.status_code == 200, g.text
                    scores.append(scorer.polarity_scores(g.json()["text"])["compound"])
                mean[eps] = sum(scores) / len(scores)
            assert mean[3.0] > mean[-3.0] + 0.2, mean
    finally:
        stop(proc)
