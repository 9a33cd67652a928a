"""1M x 384 float32 rows: WordNet MiniLM rows (40,960) repeated with Gaussian noise (sigma 0.02 per coord), seeded."""
import sys

import numpy as np

n, out = int(sys.argv[1]), sys.argv[2]
base = np.load("/work/shared/data/wordnet/minilm.npy").astype(np.float32)
mm = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n, base.shape[1]))
rng = np.random.default_rng(0)
for s in range(0, n, 65536):
    m = min(65536, n - s)
    idx = np.arange(s, s + m) % base.shape[0]
    mm[s:s + m] = base[idx] + rng.standard_normal((m, base.shape[1]), dtype=np.float32) * 0.02
mm.flush()
