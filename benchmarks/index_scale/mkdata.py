"""1M x 384 float32 rows: WordNet MiniLM rows (40,960) repeated with Gaussian noise (sigma 0.02 per coord), seeded."""
import argparse

import numpy as np

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("n", type=int, help="rows to write (at least 1)")
ap.add_argument("out", help="the .npy file to write")
args = ap.parse_args()
if args.n < 1:
    ap.error(f"n must be at least 1, got {args.n}")
n, out = args.n, args.out
base = np.load("/work/shared/data/wordnet/minilm.npy").astype(np.float32)
mm = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n, base.shape[1]))
rng = np.random.default_rng(0)
for s in range(0, n, 65536):
    m = min(65536, n - s)
    idx = np.arange(s, s + m) % base.shape[0]
    mm[s:s + m] = base[idx] + rng.standard_normal((m, base.shape[1]), dtype=np.float32) * 0.02
mm.flush()
