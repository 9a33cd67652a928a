"""service.lm: LM-Steer on a tiny randomly initialised Llama (no weights), plus an opt-in SmolLM2 smoke test."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from align import LinearMap  # noqa: E402
from align.exceptions import DimensionMismatchError, InputError  # noqa: E402
from align.steer import Steer, transfer_steer  # noqa: E402
from service.lm import steering as S  # noqa: E402
from _tiny_lm import tiny_lm  # noqa: E402

@pytest.fixture(scope="module")
def tiny():
    return tiny_lm()


def steer_for(model, r=2, seed=0, scale=0.3):
    d = S.output_embeddings(model).shape[1]
    rng = np.random.default_rng(seed)
    return Steer(rng.normal(size=(d, r)) * scale, rng.normal(size=(d, r)) * scale)


IDS = torch.tensor([[2, 4, 6, 10, 8, 11, 3, 5]])


def test_eps_zero_reproduces_base_logits_exactly(tiny):
    model, _ = tiny
    base = model(input_ids=IDS).logits
    s = steer_for(model)
    assert torch.equal(S.steered_logits(model, IDS, [(s, 0.0)]), base)
    assert torch.equal(S.steered_logits(model, IDS, []), base)
    assert not torch.equal(S.steered_logits(model, IDS, [(s, 0.5)]), base)
    assert torch.equal(model(input_ids=IDS).logits, base)  # the hook is gone afterwards


def test_logits_are_affine_in_eps_and_match_the_formula(tiny):
    model, _ = tiny
    s = steer_for(model)
    L = {e: S.steered_logits(model, IDS, [(s, e)]).double() for e in (-1.0, 0.0, 1.0, 2.5)}
    slope = L[1.0] - L[0.0]
    for e in (-1.0, 2.5):
        torch.testing.assert_close(L[e], L[0.0] + e * slope, atol=1e-4, rtol=1e-4)
    # explicit: h (I + eps W) E^T
    store = []
    with S._capture_hidden(model, store):
        model(input_ids=IDS)
    h = store[-1].double()
    E = S.output_embeddings(model).double()
    W = torch.from_numpy(s.W)
    torch.testing.assert_close(L[2.5], h @ (torch.eye(W.shape[0], dtype=torch.float64) + 2.5 * W) @ E.T,
                               atol=1e-4, rtol=1e-4)


def test_composition_is_additive(tiny):
    model, _ = tiny
    a, b = steer_for(model, seed=1), steer_for(model, r=3, seed=2)
    L0 = S.steered_logits(model, IDS).double()
    La = S.steered_logits(model, IDS, [(a, 0.7)]).double()
    Lb = S.steered_logits(model, IDS, [(b, -1.3)]).double()
    Lab = S.steered_logits(model, IDS, [(a, 0.7), (b, -1.3)]).double()
    torch.testing.assert_close(Lab, La + Lb - L0, atol=1e-4, rtol=1e-4)


def test_transfer_with_exact_map_gives_equal_scores(tiny):
    """Space B is an exact linear image of A (h_B = h_A M, E_B = E_A M): the steer's bilinear term
    h W E^T is the same after transfer; with an orthogonal M the full steered logits agree."""
    model, _ = tiny
    store = []
    with S._capture_hidden(model, store):
        model(input_ids=IDS)
    hA = store[-1][0].double()
    EA = S.output_embeddings(model).double()
    d = hA.shape[1]
    rng = np.random.default_rng(0)
    s = steer_for(model)

    def logits(h, E, st, eps):
        P1, P2 = torch.from_numpy(st.P1).double(), torch.from_numpy(st.P2).double()
        return S._steer_hidden(h, eps * P1, P2) @ E.T

    M = torch.from_numpy(rng.normal(size=(d, d + 4)) + 2 * np.eye(d, d + 4))  # wider, full row rank
    t = transfer_steer(s, LinearMap(M.numpy()))
    hB, EB = hA @ M, EA @ M
    term_B = logits(hB, EB, t, 0.8) - hB @ EB.T
    term_A = logits(hA, EA, s, 0.8) - hA @ EA.T
    torch.testing.assert_close(term_B, term_A, atol=1e-3, rtol=1e-3)

    R = torch.from_numpy(np.linalg.qr(rng.normal(size=(d, d)))[0])  # orthogonal: whole logits agree
    t = transfer_steer(s, LinearMap(R.numpy()))
    torch.testing.assert_close(logits(hA @ R, EA @ R, t, -1.5), logits(hA, EA, s, -1.5), atol=1e-3, rtol=1e-3)


def test_wrong_dim_and_bad_eps(tiny):
    model, _ = tiny
    with pytest.raises(DimensionMismatchError):
        S.steered_logits(model, IDS, [(Steer(np.ones((5, 1)), np.ones((5, 1))), 1.0)])
    with pytest.raises(InputError):
        S.steered_logits(model, IDS, [(steer_for(model), float("nan"))])


POS = ["the film was good", "a lovely story and great music", "it was very happy and fine",
       "the actors were great and lovely", "really good movie", "the ending was happy"]
NEG = ["the film was bad", "a dull story and awful music", "it was very sad and poor",
       "the actors were awful and dull", "really bad movie", "the ending was sad"]


@pytest.fixture(scope="module")
def trained(tiny):
    model, tok = tiny
    texts, labels = POS * 3 + NEG * 3, [1] * 18 + [-1] * 18
    s = S.fit_lm_steer(model, tok, texts, labels, rank=4, epsilon=1.0, init_var=0.1, lr=0.05, n_steps=150,
                       batch_tokens=64, random_state=0)
    return model, tok, s


def test_fit_learns_the_style(trained):
    model, tok, s = trained
    assert s.dim == 16 and s.rank == 4
    assert s.metadata["loss_last10"] < s.metadata["loss_base"]
    # the positive texts are likelier at eps=+1 than at eps=-1, the negative ones the other way round
    ppl = {e: (S.perplexity(model, tok, POS, [(s, e)]), S.perplexity(model, tok, NEG, [(s, e)])) for e in (-1, 1)}
    assert ppl[1][0] < ppl[-1][0]
    assert ppl[-1][1] < ppl[1][1]


def test_fit_is_deterministic(tiny):
    model, tok = tiny
    kw = dict(rank=2, n_steps=5, batch_tokens=16, random_state=3)
    a = S.fit_lm_steer(model, tok, POS + NEG, [1] * 6 + [-1] * 6, **kw)
    b = S.fit_lm_steer(model, tok, POS + NEG, [1] * 6 + [-1] * 6, **kw)
    np.testing.assert_array_equal(a.P1, b.P1)


def test_precomputed_hidden_states_give_the_same_fit_and_bad_ones_are_refused(tiny):
    model, tok = tiny
    ids = [list(tok(t)["input_ids"]) for t in POS + NEG]
    kw = dict(rank=2, n_steps=5, batch_tokens=16, random_state=3, val_fraction=0.2, eval_every=2)
    a = S.fit_lm_steer_ids(model, ids, [1] * 6 + [-1] * 6, **kw)
    hs = S.final_hidden_states(model, ids)
    b = S.fit_lm_steer_ids(model, ids, [1] * 6 + [-1] * 6, hidden_states=hs, **kw)
    np.testing.assert_array_equal(a.P1, b.P1)
    np.testing.assert_array_equal(a.P2, b.P2)
    with pytest.raises(InputError):
        S.fit_lm_steer_ids(model, ids, [1] * 6 + [-1] * 6, hidden_states=hs[:-1], **kw)
    with pytest.raises(InputError):
        S.fit_lm_steer_ids(model, ids, [1] * 6 + [-1] * 6, hidden_states=[h[:-1] for h in hs], **kw)


def test_cached_base_logits_give_the_same_fit_up_to_float16(tiny):
    model, tok = tiny
    ids = [list(tok(t)["input_ids"]) for t in POS * 2 + NEG * 2]
    kw = dict(rank=2, epsilon=1.0, init_var=0.1, lr=0.05, n_steps=30, batch_tokens=32, random_state=1,
              val_fraction=0.25, eval_every=5, patience=100, kl_weight=0.1)
    a = S.fit_lm_steer_ids(model, ids, [1] * 12 + [-1] * 12, **kw)
    b = S.fit_lm_steer_ids(model, ids, [1] * 12 + [-1] * 12, cache_logits=True, **kw)
    assert a.metadata["params"]["cache_logits"] is False and b.metadata["params"]["cache_logits"] is True
    for key in ("loss_base", "loss_first", "val_loss_base", "val_loss_best"):
        assert abs(a.metadata[key] - b.metadata[key]) < 5e-3, key
    assert np.linalg.norm(a.W - b.W) < 0.02 * np.linalg.norm(a.W)
    assert b.metadata["val_loss_best"] < b.metadata["val_loss_base"]   # the steer explains held-out texts


def test_fit_loss_is_the_cross_entropy_of_the_steered_logits(tiny):
    """The factorised training logits (base + eps0 (s h P1)(E P2)^T) equal h (I + eps0 s W) E^T. Copies of
    one positive and one negative text, half held out: whichever copies are held out, the held-out loss
    after one step at lr 0 is the exact cross-entropy of both texts under :func:`steered_logits`."""
    model, tok = tiny
    pos, neg = list(tok(POS[1])["input_ids"]), list(tok(NEG[3])["input_ids"])
    for cache in (False, True):
        s = S.fit_lm_steer_ids(model, [pos] * 4 + [neg] * 4, [1] * 4 + [-1] * 4, rank=2, epsilon=1.0,
                               init_var=0.3, lr=0.0, n_steps=1, batch_tokens=8, val_fraction=0.5, eval_every=1,
                               dummy_steer=False, random_state=0, cache_logits=cache)
        ce, n = 0.0, 0
        for x, lab in ((pos, 1.0), (neg, -1.0)):
            lg = S.steered_logits(model, [x], [(s, lab)])[0, :-1]
            ce += float(torch.nn.functional.cross_entropy(lg, torch.as_tensor(x[1:]), reduction="sum"))
            n += len(x) - 1
        assert s.metadata["val_curve"][0][1] == pytest.approx(ce / n, abs=1e-3 if cache else 1e-5)
        assert abs(s.metadata["val_curve"][0][1] - s.metadata["val_loss_base"]) > 1e-3   # the steer matters


def test_lens_and_evidence(trained):
    model, tok, s = trained
    dims = S.word_dimensions(model, tok, s, k=3, n_directions=2)
    assert len(dims) == 2 and all(len(d["positive"]) == 3 and "text" in d["positive"][0] for d in dims)
    ev = S.token_evidence(model, tok, s, "the film was good and the music was awful")
    assert [t for t, _ in ev] == "film was good and the music was awful".split()
    score = dict(ev)
    assert score["good"] > score["awful"]
    spans = S.evidence_spans(ev, threshold=0.0)
    assert sum(sp["end"] - sp["start"] for sp in spans) == len(ev)


def test_generate_runs_with_steers(trained):
    model, tok, s = trained
    a = S.generate(model, tok, "the film", [(s, 1.0)], max_new_tokens=5, do_sample=False)
    b = S.generate(model, tok, "the film", [(s, 1.0)], max_new_tokens=5, do_sample=False)
    assert isinstance(a, str) and a == b


def test_bad_labels(tiny):
    model, tok = tiny
    with pytest.raises(InputError):
        S.fit_lm_steer(model, tok, POS, [1] * len(POS))  # one class only
    with pytest.raises(InputError):
        S.fit_lm_steer(model, tok, ["the film", ""], [1, -1])


# --- opt-in smoke test on the real model ----------------------------------------------------
@pytest.mark.slow
def test_smollm2_smoke(request):
    if "slow" not in (request.config.getoption("-m") or "") and not os.environ.get("VECBRIDGE_RUN_SLOW"):
        pytest.skip("opt-in: pytest -m slow")
    from service.lm.model import LMUnavailableError, load_lm

    try:
        model, tok = load_lm()
    except LMUnavailableError as exc:
        pytest.skip(str(exc))
    pos = ["I loved this film, it was wonderful.", "What a great and happy day.", "The food was delicious.",
           "She is kind and brilliant.", "A beautiful, moving story."]
    neg = ["I hated this film, it was terrible.", "What an awful and sad day.", "The food was disgusting.",
           "She is cruel and stupid.", "An ugly, boring story."]
    s = S.fit_lm_steer(model, tok, pos + neg, [1] * 5 + [-1] * 5, rank=8, n_steps=40, batch_tokens=64,
                       random_state=0)
    assert s.dim == model.config.hidden_size
    held_pos, held_neg = ["The movie was lovely and fun."], ["The movie was dreadful and dull."]
    assert S.perplexity(model, tok, held_pos, [(s, 1.0)]) < S.perplexity(model, tok, held_pos, [(s, -1.0)])
    assert S.perplexity(model, tok, held_neg, [(s, -1.0)]) < S.perplexity(model, tok, held_neg, [(s, 1.0)])
    assert isinstance(S.generate(model, tok, "The weather today is", [(s, 2.0)], max_new_tokens=8), str)
