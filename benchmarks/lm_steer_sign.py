"""Does an LM steer push one way, or flip with the context? (issue 13, a diagnostic)

A rank-1 LM steer shifts the final hidden state by ``eps (h·u) v`` (``W = u vᵀ``, :mod:`service.lm.steering`):
along ``v`` when ``h·u > 0`` and against it otherwise. This samples continuations of the neutral prompts of
``bench_lm_steer.py`` from the unsteered SmolLM2 (seeded; top_p 0.9) and prints the distribution of ``h·u`` over
the generated positions, and the vocabulary at both ends of ``v`` (``E v``).

Run: ``python benchmarks/lm_steer_sign.py --steer benchmarks/results/steer_lm_fits_2026-12-01c_0.steer.npz``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steer", required=True, help="a saved LM steer (.npz); its top singular direction is used")
    ap.add_argument("--new-tokens", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from bench_lm_steer import PROMPTS

    from align.steer import Steer
    from service.lm.model import load_lm
    from service.lm.steering import _capture_hidden, output_embeddings

    model, tok = load_lm()
    steer = Steer.load(args.steer).top(1)
    u, v = steer.P1[:, 0], steer.P2[:, 0]
    store: list = []
    torch.manual_seed(args.seed)
    with _capture_hidden(model, store), torch.no_grad():
        for p in PROMPTS:
            ids = tok(p, return_tensors="pt").input_ids
            model.generate(ids, do_sample=True, top_p=0.9, max_new_tokens=args.new_tokens,
                           pad_token_id=tok.eos_token_id)
    H = torch.cat([x.reshape(-1, x.shape[-1]) for x in store]).float().numpy()
    a = H @ u
    print(f"{len(a)} positions; h·u mean {a.mean():.3f}, sd {a.std():.3f}, share > 0 {(a > 0).mean():.3f}, "
          f"share < 0 {(a < 0).mean():.3f}")
    ev = output_embeddings(model).float().numpy() @ v
    order = np.argsort(ev)
    print("+v end:", [tok.decode([int(i)]) for i in order[-12:][::-1]])
    print("-v end:", [tok.decode([int(i)]) for i in order[:12]])


if __name__ == "__main__":
    main()
