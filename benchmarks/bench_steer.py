"""Benchmark: LM-Steer style steers in embedding space (WordNet) and on SmolLM2 (sentiment).

Embedding part (``ALGORITHMS.md`` §6, offline data ``shared/data/wordnet``):

* Attributes are WordNet lexicographer files (``noun.plant``, ``noun.animal``, ...), read from the
  Debian ``wordnet-base`` data files (``lex_filenum`` of the synset whose gloss is the text).
* Split: labelled training pool = rows ``[0, 16384)`` (+1 = attribute A, -1 = attribute B,
  0 = every other row, a neutral context); retrieval corpus = rows ``[16384, 32768)`` (items never
  seen in training); queries = 1,000 random held-out rows from ``[32768, 40960)`` (any category).
* Metrics per ``eps``: precision@10 of A (and of B) among the retrieved corpus items, and
  overlap@10 with the unsteered top-10 (relevance retained). Baselines: no steer (eps = 0) and the
  mean-difference shift ``q + eps |q| (mean(A) - mean(B))``.
* Transfer minilm -> e5: an orthogonal Procrustes map fitted on *paired* training rows
  ``[0, 16384)`` (supervised, for this purpose only), the minilm steer carried over with
  ``H^T W H``; compared with a steer fitted natively in e5 on the same labels.

LM part (``--lm``): a sentiment steer trained on SmolLM2-135M-Instruct from short labelled
sentences written for this benchmark; generations from neutral held-out prompts at several eps,
scored with a tiny positive/negative word lexicon (a *weak* scorer: word counts, no negation) and
their perplexity under the unsteered model; plus perplexity of held-out neutral sentences under
the steered model. Not comparable to the paper's GPT-2-large numbers (different model, data, scorer).

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_steer.py [--lm] [--no-wordnet]``.
Writes ``benchmarks/results/steer_wordnet.json``, ``steer_lm.json`` and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import align  # noqa: E402
from align.knn import knn  # noqa: E402
from align.steer import fit_mean_shift, fit_steer, transfer_steer  # noqa: E402

WORDNET = ROOT.parent / "shared" / "data" / "wordnet"
WN_DICT = Path("/usr/share/wordnet")
RESULTS = ROOT / "benchmarks" / "results"

# WordNet 3.0 lexicographer files, in lex_filenum order (the ``lexnames`` file).
LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
    "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location "
    "noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process "
    "noun.quantity noun.relation noun.shape noun.state noun.substance noun.time verb.body verb.change "
    "verb.cognition verb.communication verb.competition verb.consumption verb.contact verb.creation "
    "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl"
).split()

TASKS = [("noun.plant", "noun.animal"), ("noun.person", "noun.artifact"), ("noun.food", "noun.substance")]
EPS = [-1.0, 0.0, 0.25, 0.5, 1.0, 2.0, 4.0]
MS_EPS = [-0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 4.0]
TRAIN, CORPUS, HELD = (0, 16384), (16384, 32768), (32768, 40960)


def lexnames_for(texts: list[str]) -> np.ndarray:
    """Lexicographer file of each definition (``''`` when unknown or ambiguous)."""
    found: dict[str, set] = {}
    for pos in ("noun", "verb", "adj", "adv"):
        with open(WN_DICT / f"data.{pos}", encoding="latin-1") as fh:
            for line in fh:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition(" | ")
                found.setdefault(gloss.split('; "')[0].strip(), set()).add(LEXNAMES[int(head.split()[1])])
    return np.array([next(iter(found[t])) if len(found.get(t, ())) == 1 else "" for t in texts])


def evaluate(Qs: np.ndarray, corpus: np.ndarray, lex: np.ndarray, a: str, b: str, I0: np.ndarray, k: int = 10):
    _, I = knn(Qs, corpus, k)
    overlap = np.mean([len(set(x) & set(y)) / k for x, y in zip(I, I0)])
    return {"prec_A": float((lex[I] == a).mean()), "prec_B": float((lex[I] == b).mean()), "overlap": float(overlap)}


def best_at_overlap(rows: list[dict], floor: float = 0.5) -> float:
    ok = [r["prec_A"] for r in rows if r["overlap"] >= floor]
    return max(ok) if ok else float("nan")


def wordnet_bench(n_queries: int = 1000, rank: int = 16, seed: int = 0) -> dict:
    texts = json.loads((WORDNET / "texts.json").read_text())
    lex = lexnames_for(texts)
    emb = {name: np.load(WORDNET / f"{name}.npy").astype(np.float32) for name in ("minilm", "e5")}
    rng = np.random.default_rng(seed)
    qidx = rng.choice(np.arange(*HELD), size=n_queries, replace=False)
    tr, co = slice(*TRAIN), slice(*CORPUS)
    lex_c = lex[co]
    t0 = time.time()
    pmap = align.fit_procrustes(emb["minilm"][tr], emb["e5"][tr])  # paired rows: supervised map
    out = {"setup": {"n_queries": n_queries, "rank": rank, "train_rows": TRAIN, "corpus_rows": CORPUS,
                     "query_rows": HELD, "k": 10, "eps": EPS, "mean_shift_eps": MS_EPS,
                     "map": "fit_procrustes minilm->e5 on paired rows [0,16384)",
                     "procrustes_seconds": round(time.time() - t0, 1)}, "tasks": []}
    for a, b in TASKS:
        labels = np.where(lex[tr] == a, 1, np.where(lex[tr] == b, -1, 0))
        task = {"A": a, "B": b, "n_A": int((labels == 1).sum()), "n_B": int((labels == -1).sum()),
                "corpus_base_rate_A": float((lex_c == a).mean()), "spaces": {}}
        steers = {}
        for space in ("minilm", "e5"):
            X, Q, C = emb[space][tr], emb[space][qidx], emb[space][co]
            _, I0 = knn(Q, C, 10)
            t0 = time.time()
            st = fit_steer(X, labels, rank=rank, max_iter=150, random_state=seed)
            fit_s = time.time() - t0
            steers[space] = st
            ms = fit_mean_shift(X, labels)
            res = {"fit_seconds": round(fit_s, 1), "loss": [st.metadata["loss_initial"], st.metadata["loss_final"]],
                   "steer": [{"eps": e, **evaluate(st.apply(Q, e), C, lex_c, a, b, I0)} for e in EPS],
                   "mean_shift": [{"eps": e, **evaluate(ms.apply(Q, e), C, lex_c, a, b, I0)} for e in MS_EPS]}
            if space == "e5":
                moved = transfer_steer(steers["minilm"], pmap)
                res["transferred_from_minilm"] = [{"eps": e, **evaluate(moved.apply(Q, e), C, lex_c, a, b, I0)}
                                                  for e in EPS]
            task["spaces"][space] = res
        out["tasks"].append(task)
        print(f"done {a} vs {b}", file=sys.stderr, flush=True)
    return out


def wordnet_tables(res: dict) -> str:
    lines = []
    for task in res["tasks"]:
        lines.append(f"\n### {task['A']} (+1, n={task['n_A']}) vs {task['B']} (-1, n={task['n_B']}); "
                     f"corpus base rate of A {task['corpus_base_rate_A']:.3f}\n")
        for space, r in task["spaces"].items():
            lines.append(f"**{space}** (fit {r['fit_seconds']} s, loss {r['loss'][0]:.3f} -> {r['loss'][1]:.3f})\n")
            cols = [("steer", r["steer"]), ("mean-shift", r["mean_shift"])]
            if "transferred_from_minilm" in r:
                cols.append(("transferred minilm->e5", r["transferred_from_minilm"]))
            lines.append("| method | eps | prec@10 A | prec@10 B | overlap@10 |")
            lines.append("|---|---:|---:|---:|---:|")
            for name, rows in cols:
                for row in rows:
                    lines.append(f"| {name} | {row['eps']:g} | {row['prec_A']:.3f} | {row['prec_B']:.3f} | "
                                 f"{row['overlap']:.3f} |")
            summ = ", ".join(f"{name} {best_at_overlap(rows):.3f}" for name, rows in cols)
            lines.append(f"\nbest prec@10 A with overlap@10 >= 0.5: {summ}\n")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# LM part
# --------------------------------------------------------------------------------------------
POS_TRAIN = [
    "I loved every minute of this film; it was wonderful.", "What a beautiful morning, I feel so happy.",
    "The staff were friendly and the food was delicious.", "She gave a brilliant, inspiring speech.",
    "This is the best book I have read in years.", "Our holiday was relaxing and full of joy.",
    "The new update works perfectly and feels great.", "He is kind, generous and always helpful.",
    "The concert was amazing and the crowd was cheerful.", "I am grateful for such lovely friends.",
    "The garden looks gorgeous in the spring sunshine.", "A delightful, charming little cafe.",
    "The team played superbly and won with style.", "Thank you, this gift is perfect and thoughtful.",
    "The hotel room was clean, bright and comfortable.", "Such a fun, uplifting and heartwarming story.",
    "My exam went well and I am thrilled.", "The puppy is adorable and full of happy energy.",
    "The soup was fresh, warm and tasty.", "I enjoyed the walk; the view was stunning.",
    "Everyone at the party was smiling and laughing.", "The doctor was caring and the news was good.",
    "What an excellent idea, I love it.", "The kids had a fantastic, joyful afternoon.",
]
NEG_TRAIN = [
    "I hated every minute of this film; it was terrible.", "What a miserable morning, I feel so sad.",
    "The staff were rude and the food was disgusting.", "She gave a boring, painful speech.",
    "This is the worst book I have read in years.", "Our holiday was stressful and full of misery.",
    "The new update is broken and feels awful.", "He is cruel, selfish and always unhelpful.",
    "The concert was dreadful and the crowd was angry.", "I am tired of such nasty neighbours.",
    "The garden looks ugly and dead in the cold rain.", "A dirty, gloomy little cafe.",
    "The team played horribly and lost badly.", "No thanks, this gift is useless and cheap.",
    "The hotel room was filthy, dark and uncomfortable.", "Such a dull, depressing and bleak story.",
    "My exam went badly and I am upset.", "The dog is sick and whines in pain.",
    "The soup was cold, stale and bland.", "I regret the walk; the view was hideous.",
    "Everyone at the party was bored and annoyed.", "The doctor was careless and the news was bad.",
    "What a stupid idea, I hate it.", "The kids had a horrible, tearful afternoon.",
]
PROMPTS = ["The weather this weekend", "My neighbour's new car", "The meeting this morning", "Yesterday at the market",
           "The train to the city", "Our old kitchen", "The last episode of the show", "When I opened the letter",
           "The restaurant on the corner", "The first day at the new job"]
NEUTRAL_HELD = ["The library opens at nine and closes at six on weekdays.",
                "He put the keys on the table and went upstairs.",
                "The report has three sections and an appendix.",
                "Trains leave the station every twenty minutes.",
                "She wrote the address on the back of the envelope."]
LEX_POS = set("good great love loved lovely happy wonderful beautiful best excellent amazing fantastic enjoy enjoyed "
              "nice fun joy joyful delightful perfect glad pleasant brilliant beautifully kind friendly delicious "
              "fresh bright charming gorgeous thrilled cheerful smile smiling laugh laughing awesome favorite "
              "comfortable warm hope peaceful exciting excited incredible".split())
LEX_NEG = set("bad terrible awful hate hated horrible worst sad miserable boring dull ugly angry rude disgusting "
              "dreadful nasty cruel painful pain sick dirty filthy gloomy broken useless stupid annoyed upset "
              "depressing bleak cold stale bland careless tearful cry crying fear afraid poor wrong worse "
              "disappointing disappointed dead death lost worried".split())
LM_EPS = [-3.0, -1.0, 0.0, 1.0, 3.0]


def lexicon_score(text: str) -> tuple[int, int, int]:
    words = re.findall(r"[a-z']+", text.lower())
    return sum(w in LEX_POS for w in words), sum(w in LEX_NEG for w in words), len(words)


def lm_bench(seed: int = 0, samples: int = 2, max_new_tokens: int = 20) -> dict:
    import torch

    from service.lm import steering as S
    from service.lm.model import load_lm

    torch.set_num_threads(2)
    t0 = time.time()
    model, tok = load_lm()
    load_s = time.time() - t0
    t0 = time.time()
    steer = S.fit_lm_steer(model, tok, POS_TRAIN + NEG_TRAIN, [1] * len(POS_TRAIN) + [-1] * len(NEG_TRAIN),
                           rank=32, epsilon=1e-3, lr=1e-2, n_steps=120, batch_tokens=128, random_state=seed)
    fit_s = time.time() - t0
    rows = []
    for e in LM_EPS:
        t0 = time.time()
        gens, prompts = [], []
        for p in PROMPTS:
            for j in range(samples):
                gens.append(S.generate(model, tok, p, [(steer, e)], max_new_tokens=max_new_tokens, seed=seed + j))
                prompts.append(p)
        counts = np.array([lexicon_score(g) for g in gens])
        ppl_gen = S.perplexity(model, tok, gens, prompts=prompts)          # fluency under the base model
        ppl_held = S.perplexity(model, tok, NEUTRAL_HELD, [(steer, e)])    # held-out text under the steer
        rows.append({"eps": e, "pos_words": int(counts[:, 0].sum()), "neg_words": int(counts[:, 1].sum()),
                     "words": int(counts[:, 2].sum()),
                     "positivity": float((counts[:, 0] - counts[:, 1]).sum() / max(1, counts[:, 2].sum()) * 100),
                     "frac_more_pos": float((counts[:, 0] > counts[:, 1]).mean()),
                     "frac_more_neg": float((counts[:, 1] > counts[:, 0]).mean()),
                     "ppl_generations_base": ppl_gen, "ppl_heldout_steered": ppl_held,
                     "example": f"{prompts[0]}{gens[0]}", "seconds": round(time.time() - t0, 1)})
        print(f"lm eps={e} done", file=sys.stderr, flush=True)
    dims = S.word_dimensions(model, tok, steer, k=8, n_directions=2)
    ev = S.token_evidence(model, tok, steer, "The food was delicious but the service was terrible.")
    return {"setup": {"model": "SmolLM2-135M-Instruct (GGUF Q4_1, de-quantised to float32)",
                      "train_texts": len(POS_TRAIN) + len(NEG_TRAIN), "prompts": len(PROMPTS),
                      "samples_per_prompt": samples, "max_new_tokens": max_new_tokens, "sampling": "top_p=0.9",
                      "scorer": "weak: word-list counts (no negation, no context)",
                      "load_seconds": round(load_s, 1), "fit_seconds": round(fit_s, 1), "steer": steer.metadata},
            "rows": rows,
            "lens": [{"direction": d["direction"], "sigma": d["sigma"], "positive": [x["text"] for x in d["positive"]],
                      "negative": [x["text"] for x in d["negative"]]} for d in dims],
            "evidence": [[t, round(v, 3)] for t, v in ev]}


def lm_table(res: dict) -> str:
    lines = ["| eps | positivity (pos-neg per 100 words) | frac gens more pos | frac more neg | "
             "ppl of gens (base LM) | ppl held-out (steered) |", "|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['eps']:g} | {r['positivity']:.2f} | {r['frac_more_pos']:.2f} | {r['frac_more_neg']:.2f} | "
                     f"{r['ppl_generations_base']:.1f} | {r['ppl_heldout_steered']:.1f} |")
    lines.append("")
    for r in res["rows"]:
        lines.append(f"- eps {r['eps']:g}: {r['example']!r}")
    for d in res["lens"]:
        lines.append(f"- lens direction {d['direction']} (sigma {d['sigma']:.3g}): + {d['positive']} / - {d['negative']}")
    lines.append(f"- evidence: {res['evidence']}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lm", action="store_true", help="also run the SmolLM2 part (a few CPU minutes)")
    ap.add_argument("--no-wordnet", action="store_true")
    ap.add_argument("--queries", type=int, default=1000)
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.no_wordnet:
        res = wordnet_bench(n_queries=args.queries)
        (RESULTS / "steer_wordnet.json").write_text(json.dumps(res, indent=1))
        print(wordnet_tables(res))
    if args.lm:
        res = lm_bench()
        (RESULTS / "steer_lm.json").write_text(json.dumps(res, indent=1))
        print(lm_table(res))


if __name__ == "__main__":
    main()
