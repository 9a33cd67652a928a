"""Build ``service/data/demo_wordnet.npz``: the demo's texts and their vectors in both spaces.

The demo (``service/ops/demo.py``) must be usable seconds after the service starts, so it ships its
vectors instead of embedding texts with two encoders at start-up. This script makes that file:
``n`` WordNet definitions (distinct, >= 4 words) and their embeddings by ``all-MiniLM-L6-v2``
(space ``minilm``) and ``multilingual-e5-small`` (space ``e5``, ``passage:`` form), unit rows,
stored as float16, in an ``.npz`` read with ``allow_pickle=False``.

    python scripts/build_demo_data.py                 # rows of the shared precomputed set (fast)
    python scripts/build_demo_data.py --encode        # embed the texts here with the installed encoders

The shared set ``../shared/data/wordnet/{texts.json,minilm.npy,e5.npy}`` holds the same two
encoders' embeddings of 40,960 definitions (DATA.md); the rows are drawn (seeded) from its
held-out range [32768, 40960). ``--encode`` re-embeds the drawn texts and needs the
``encoders`` extra; both ways give the same vectors up to float16 rounding.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "wordnet"
OUT = ROOT / "service" / "data" / "demo_wordnet.npz"
HELD = (32768, 40960)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="number of texts (default 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--encode", action="store_true", help="embed with the installed encoders instead")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    texts_all = json.loads((args.shared / "texts.json").read_text())
    rng = np.random.default_rng(args.seed)
    rows = np.sort(rng.choice(np.arange(*HELD), args.n, replace=False))
    texts = [texts_all[i] for i in rows]
    if args.encode:
        sys.path.insert(0, str(ROOT))
        from service.encoders import get_encoder

        minilm = get_encoder("minilm").encode(texts, kind="passage")
        e5 = get_encoder("e5").encode(texts, kind="passage")
        origin = "embedded by scripts/build_demo_data.py --encode"
    else:
        minilm = np.load(args.shared / "minilm.npy", mmap_mode="r")[rows]
        e5 = np.load(args.shared / "e5.npy", mmap_mode="r")[rows]
        origin = f"rows of {args.shared.name}/{{minilm,e5}}.npy (held-out range {HELD[0]}..{HELD[1]})"

    def unit16(a):
        a = np.asarray(a, np.float32)
        return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float16)

    meta = {"corpus": "WordNet definitions (wordnet-base)", "n_texts": len(texts), "seed": args.seed,
            "source_rows": origin, "spaces": {"minilm": "all-MiniLM-L6-v2", "e5": "multilingual-e5-small"},
            "e5_form": "passage"}
    buf = io.BytesIO()
    np.savez_compressed(buf, texts=np.asarray(texts, dtype=str), minilm=unit16(minilm), e5=unit16(e5),
                        meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(buf.getvalue())
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB, {len(texts)} texts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
