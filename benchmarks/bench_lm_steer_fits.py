"""Benchmark: LM-Steer fit settings on SmolLM2-135M compared by held-out loss (no generation).

Same corpus, selection and 10 % held-out split as ``bench_lm_steer.py`` (human-rated vaderSentiment
sdist sentences, ``--per-class`` per polarity, seeded). Each setting is one ``fit_lm_steer_ids`` run
with cached base logits (``cache_logits=True``) and early stopping on the held-out loss; the table
gives the held-out loss of the unsteered model, of the best step, the step it came at, the steps run
and seconds. A lower held-out loss means the steer explains more of the labelled texts; it is the
cheap criterion for picking which fits get the slow generation evaluation.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_lm_steer_fits.py --settings "rank=16,lr=0.01" "rank=1"``;
writes ``benchmarks/results/<stem>.{json,md}`` and each fitted steer as ``<stem>_<i>.steer.npz``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "benchmarks" / "results"
DEFAULTS = {"rank": 16, "lr": 1e-2, "batch_tokens": 1024, "n_steps": 3000, "eval_every": 50, "patience": 6,
            "dummy_steer": True, "max_length": 32, "kl_weight": 0.0, "epsilon": 1e-3, "regularization": 0.0}


def parse(spec: str) -> dict:
    out = dict(DEFAULTS)
    for part in filter(None, spec.split(",")):
        k, v = part.split("=")
        out[k] = (v.lower() in ("1", "true", "yes")) if isinstance(DEFAULTS[k], bool) else type(DEFAULTS[k])(float(v))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "vecbridge" / "vader"))
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--balance-sources", action="store_true", help="see bench_lm_steer.training_set")
    ap.add_argument("--stem", default="steer_lm_fits_2026-12-01")
    ap.add_argument("--settings", nargs="+", default=[""], help="comma-separated key=value over the defaults")
    args = ap.parse_args(argv)

    import torch

    from bench_lm_steer import cached_hidden_states, training_set
    from service.lm import steering as S
    from service.lm.corpus import fetch_vader_sdist
    from service.lm.model import load_lm

    torch.set_num_threads(args.threads)
    texts, labels = training_set(fetch_vader_sdist(args.cache), args.per_class, args.seed, args.balance_sources)
    model, tok = load_lm()
    out_json = RESULTS / f"{args.stem}.json"
    rows = json.loads(out_json.read_text())["rows"] if out_json.is_file() else []
    for spec in args.settings:
        p = parse(spec)
        ids = [list(tok(t, truncation=True, max_length=p["max_length"])["input_ids"]) for t in texts]
        hidden = cached_hidden_states(model, ids, Path(args.cache))
        t0 = time.time()
        steer = S.fit_lm_steer_ids(model, ids, labels, rank=p["rank"], epsilon=p["epsilon"], lr=p["lr"],
                                   n_steps=p["n_steps"], batch_tokens=p["batch_tokens"], val_fraction=0.1,
                                   eval_every=p["eval_every"], patience=p["patience"], kl_weight=p["kl_weight"],
                                   regularization=p["regularization"], dummy_steer=p["dummy_steer"],
                                   random_state=args.seed, hidden_states=hidden, cache_logits=True,
                                   progress=lambda k, loss: print(f"step {k} loss {loss:.3f} {time.time() - t0:.0f}s",
                                                                  file=sys.stderr, flush=True) if k % 50 == 0 else None)
        m = steer.metadata
        i = len(rows)
        name = f"{args.stem}_{i}.steer.npz"
        steer.save(RESULTS / name)
        sv = np.linalg.svd(steer.W, compute_uv=False)
        row = {"spec": (spec or "defaults") + (" [sources balanced]" if args.balance_sources else ""), "params": p, "val_loss_base": m["val_loss_base"],
               "val_loss_best": m["val_loss_best"], "best_step": m["best_step"], "steps_run": m["steps_run"],
               "seconds": round(time.time() - t0, 1), "val_curve": m["val_curve"], "steer": name,
               "sigma_top3": [float(x) for x in sv[:3]]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("val_curve", "params")}), file=sys.stderr, flush=True)
        RESULTS.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps({"rows": rows}, indent=1))
        (RESULTS / f"{args.stem}.md").write_text(table(rows, args.per_class))
    print(table(rows, args.per_class))


def table(rows, per_class: int) -> str:
    lines = [f"# LM-Steer fit settings on SmolLM2-135M: held-out loss ({time.strftime('%Y-%m-%d')})", "",
             f"{2 * per_class:,} human-rated sentences (vaderSentiment sdist), {per_class:,} per polarity, 10% held "
             "out (same selection and split as `bench_lm_steer.py --per-class`); early stopping on the held-out loss; "
             "base logits cached (float16).", "",
             "| # | setting | held-out loss unsteered | best | best step | steps run | sigma 1/2/3 | seconds |",
             "|---|---|---:|---:|---:|---:|---|---:|"]
    for i, r in enumerate(rows):
        lines.append(f"| {i} | {r['spec']} | {r['val_loss_base']:.4f} | {r['val_loss_best']:.4f} | {r['best_step']} | "
                     f"{r['steps_run']} | {'/'.join(f'{x:.3g}' for x in r['sigma_top3'])} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
