"""Benchmark: FAISS on a GPU beside FAISS on the CPU of the same machine (issue 11's GPU check).

Three questions, one run:

1. **Same ids?** The demo index (the packaged 1,000 WordNet definitions embedded by e5) searched with the demo
   map's MiniLM queries (Procrustes fitted on rows 0:500, queries rows 500:1000): the top-10 ids of a flat
   (exact inner-product) index on the GPU against the CPU's, and the map's top-1 on each.
2. **How fast?** Flat and IVF searches (k=10) at batch 1 / 64 / 1,024 over the demo index and over
   ``--rows`` rows (default 1,000,000: the demo's e5 rows repeated with Gaussian noise of 0.05 per
   coordinate and renormalised, a stand-in for a big corpus, said so in the table). Median ms per call,
   CPU (FAISS's threads: every core) beside GPU, and the ratio.
   The GPU column of flat indexes is the service's own GPU search (``search_device=cuda``,
   :mod:`service.indexes.device`) where FAISS's GPU build cannot search on the card.
3. **The map apply** the service runs on the CPU (``LinearMap.apply``, numpy GEMM) beside the same product on
   the GPU (torch, where it is installed): what moving transforms to the GPU could buy.

Without a GPU build of FAISS (``faiss.get_num_gpus()`` absent or 0) the GPU columns say why and the CPU figures
are printed alone. The service searches flat indexes on a GPU with ``search_device=cuda`` (torch; HNSW and IVF
stay with FAISS on the CPU).

Run: ``python benchmarks/bench_gpu.py [--rows 1000000] [--out gpu.md]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEMO = ROOT / "service" / "data" / "demo_wordnet.npz"


def unit(A: np.ndarray) -> np.ndarray:
    A = np.ascontiguousarray(A, dtype=np.float32)
    return A / np.linalg.norm(A, axis=1, keepdims=True)


def gpu_state(faiss) -> tuple[int, str]:
    """``(number of GPUs FAISS sees, why none)``."""
    n = getattr(faiss, "get_num_gpus", lambda: 0)()
    if not hasattr(faiss, "StandardGpuResources"):
        return 0, "this FAISS build has no GPU support (faiss-cpu; the `gpu` extra installs faiss-gpu-cu12)"
    if n == 0:
        return 0, "FAISS has GPU support but sees no GPU"
    return n, ""


_PROBE = """
import numpy as np, faiss
X = np.random.default_rng(0).standard_normal((256, 32)).astype("float32")
g = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, faiss.IndexFlatIP(32))
g.add(X)
assert (g.search(X[:8], 1)[1][:, 0] == np.arange(8)).all()
print("ok")
"""


def probe_gpu_search(timeout: float = 120.0) -> tuple[bool, str]:
    """``(ok, last line of the child's output)``: a small GPU flat search in a child process. A FAISS build whose
    kernels do not cover the GPU aborts the process from C++ (``no kernel image is available``), which no
    ``try`` in this one could catch."""
    import subprocess

    try:
        r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout,
                           check=False)
    except subprocess.TimeoutExpired:
        return False, f"a 256-row GPU search did not answer in {timeout:.0f} s"
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    ok = r.returncode == 0 and lines[-1:] == ["ok"]
    return ok, ("ok" if ok else f"exit {r.returncode}: {(lines or ['no output'])[-1][-300:]}")


class ServiceFlat:
    """The service's GPU search of a flat index (``Settings.search_device=cuda``: :class:`service.indexes.device.
    DeviceRows`) over ``X``, where FAISS cannot search on this GPU. ``search(Q, k)`` -> ``(scores, ids)`` numpy,
    as FAISS answers."""

    def __init__(self, X: np.ndarray):
        import faiss

        from service.indexes.device import DeviceRows

        self.index = faiss.IndexIDMap2(faiss.IndexFlatIP(X.shape[1]))  # the service's flat kind (kinds.py)
        self.index.add_with_ids(X, np.arange(X.shape[0], dtype=np.int64))
        self.rows = DeviceRows("cuda")

    def search(self, Q: np.ndarray, k: int):
        return self.rows.search(self.index, 0, Q, k)


class Report:
    """Markdown lines printed as they come (``say(line)``) and kept to be written to ``--out`` at the end."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, s: str = "") -> None:
        print(s, flush=True)
        self.lines.append(s)

    def write(self, path: Path | None) -> None:
        if path is not None:
            path.write_text("\n".join(self.lines) + "\n")


def torch_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def timed(fn, *, repeat: int, budget_s: float = 5.0) -> float:
    """Median milliseconds of ``fn()`` over up to ``repeat`` calls (after one warm-up), within ``budget_s``; a
    warm-up that alone outlasts the budget is the figure (a 1M-row CPU flat search at batch 1,024 took 42 s)."""
    t0 = time.perf_counter()
    fn()
    first = (time.perf_counter() - t0) * 1e3
    if first > budget_s * 1e3:
        return first
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeat and (not times or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def demo_map():
    """``(map, A, B)``: the demo's MiniLM rows ``A`` and e5 rows ``B`` (1000, 384) and a Procrustes map fitted on
    rows 0:500."""
    import align

    with np.load(DEMO, allow_pickle=False) as z:
        A, B = z["minilm"].astype(np.float32), z["e5"].astype(np.float32)
    return align.fit_procrustes(A[:500], B[:500]), A, B


def demo_vectors(m, A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(docs (1000, 384) e5 unit rows, queries (500, 384) mapped MiniLM unit rows, relevant (500,))``."""
    return unit(B), unit(m.apply(A[500:], output="raw")), np.arange(500, 1000)


def big_corpus(docs: np.ndarray, rows: int, seed: int = 0) -> np.ndarray:
    """``rows`` unit rows: ``docs`` repeated with N(0, 0.05²) noise per coordinate (a stand-in, not real text)."""
    rng = np.random.default_rng(seed)
    out = np.empty((rows, docs.shape[1]), np.float32)
    for lo in range(0, rows, 65536):
        hi = min(rows, lo + 65536)
        block = docs[np.arange(lo, hi) % docs.shape[0]] + 0.05 * rng.standard_normal((hi - lo, docs.shape[1]),
                                                                                      dtype=np.float32)
        out[lo:hi] = unit(block)
    return out


def indexes(faiss, X: np.ndarray, kind: str, res, nlist: int, nprobe: int):
    """``(cpu index, gpu index or None)`` of ``kind`` flat / ivf over ``X``; the GPU one is a copy of the CPU one
    (same IVF centroids and lists), so the two answer the same question."""
    d = X.shape[1]
    if kind == "flat":
        cpu = faiss.IndexFlatIP(d)
    else:
        cpu = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        train = X[np.random.default_rng(1).permutation(X.shape[0])[: min(X.shape[0], 64 * nlist)]]
        cpu.train(train)
        cpu.nprobe = nprobe
    cpu.add(X)
    gpu = None
    if res is None and kind == "flat" and torch_cuda():
        gpu = ServiceFlat(X)
    elif res is not None:
        gpu = faiss.index_cpu_to_gpu(res, 0, cpu)
        if kind == "ivf":
            faiss.GpuParameterSpace().set_index_parameter(gpu, "nprobe", nprobe)
    return cpu, gpu


def agreement(cpu, gpu, Q: np.ndarray, k: int = 10) -> dict:
    """Share of queries whose top-``k`` id lists are identical, share of equal top-1, largest score gap."""
    Dc, Ic = cpu.search(Q, k)
    Dg, Ig = gpu.search(Q, k)
    return {"same_lists": float((Ic == Ig).all(axis=1).mean()), "same_top1": float((Ic[:, 0] == Ig[:, 0]).mean()),
            "max_score_gap": float(np.abs(Dc - Dg).max()), "ids_cpu": Ic, "ids_gpu": Ig}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the large stand-in corpus (0: skip)")
    ap.add_argument("--repeat", type=int, default=50, help="calls timed per cell (median; 5 s budget per cell)")
    ap.add_argument("--out", type=Path, default=None, help="also write the report (markdown) here")
    args = ap.parse_args(argv)

    import faiss

    say = Report()

    n_gpu, why = gpu_state(faiss)
    if n_gpu:
        ok, msg = probe_gpu_search()
        if not ok:
            why = f"a FAISS GPU search aborts the process on this GPU ({msg})"
    res = faiss.StandardGpuResources() if n_gpu and not why else None
    engine = "faiss" if res is not None else ("the service's search_device=cuda (torch; FAISS GPU unusable here)" if torch_cuda()
                                               else None)
    say(f"# FAISS GPU beside CPU ({time.strftime('%Y-%m-%d')})\n")
    say(f"- machine: {platform.node()}, {os.cpu_count()} CPUs, FAISS {faiss.__version__}, "
        f"FAISS threads {faiss.omp_get_max_threads()}, GPUs seen by FAISS: {n_gpu}" + (f" ({why})" if why else ""))
    say(f"- GPU column: {engine or 'none'}")
    if n_gpu:
        try:
            import torch

            say(f"- GPU: {torch.cuda.get_device_name(0)} (torch {torch.__version__})")
        except Exception as e:  # noqa: BLE001 - only a label
            say(f"- GPU name unknown ({type(e).__name__})")

    m, A, B = demo_map()
    docs, queries, relevant = demo_vectors(m, A, B)
    say("\n## 1. The demo index: the same ids?\n")
    cpu, gpu = indexes(faiss, docs, "flat", res, 0, 0)
    top1_cpu = float((cpu.search(queries, 1)[1][:, 0] == relevant).mean())
    if gpu is None:
        say(f"- flat, 500 mapped queries, k=10: CPU top-1 {top1_cpu:.3f}; GPU not run ({why})")
    else:
        a = agreement(cpu, gpu, queries)
        top1_gpu = float((a["ids_gpu"][:, 0] == relevant).mean())
        say(f"- flat, 500 mapped queries, k=10: identical top-10 lists {a['same_lists']:.3f}, identical top-1 "
            f"{a['same_top1']:.3f}, largest score gap {a['max_score_gap']:.2e}; the map's top-1 CPU "
            f"{top1_cpu:.3f} / GPU {top1_gpu:.3f}")
        diff = np.flatnonzero(~(a["ids_cpu"] == a["ids_gpu"]).all(axis=1))
        if diff.size:
            Dc, _ = cpu.search(queries[diff], 10)
            ties = np.abs(np.diff(Dc, axis=1)).min(axis=1)
            say(f"- the {diff.size} differing lists: smallest gap between neighbouring scores {ties.max():.2e} "
                f"at most (ties or float32 rounding reorder them)")

    corpora = [("demo e5", docs, 16, 4)]
    if args.rows:
        t0 = time.perf_counter()
        big = big_corpus(docs, args.rows)
        say(f"\n(built the {args.rows:,}-row stand-in corpus in {time.perf_counter() - t0:.1f} s: demo rows "
            f"repeated with noise 0.05, renormalised; not real text)")
        corpora.append((f"{args.rows:,} stand-in", big, 1024, 16))  # 4,096 lists: k-means outran 420 s there

    say("\n## 2. Search, k=10, median ms per call\n")
    say("| corpus | index | batch | CPU ms | GPU ms | CPU / GPU | same top-10 lists |")
    say("|---|---|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(2)
    for label, X, nlist, nprobe in corpora:
        for kind in ("flat", "ivf"):
            if kind == "ivf" and X.shape[0] < 40 * nlist:
                continue
            if kind == "ivf" and res is None and label != "demo e5":  # no GPU column: minutes of CPU k-means for none
                say(f"| {label} | ivf | — | — | — | — | — |")
                continue
            t0 = time.perf_counter()
            cpu, gpu = indexes(faiss, X, kind, res, nlist, nprobe)
            build = time.perf_counter() - t0
            Qall = unit(X[rng.integers(0, X.shape[0], 1024)] + 0.1 * rng.standard_normal((1024, X.shape[1]),
                                                                                            dtype=np.float32))
            same = agreement(cpu, gpu, Qall[:256])["same_lists"] if gpu is not None else None  # 1M CPU: 42 s / 1k
            for batch in (1, 64, 1024):
                Q = Qall[:batch]
                c = timed(lambda Q=Q, ix=cpu: ix.search(Q, 10), repeat=args.repeat)
                g = timed(lambda Q=Q, ix=gpu: ix.search(Q, 10), repeat=args.repeat) if gpu is not None else None
                say(f"| {label} | {kind}{'' if kind == 'flat' else f' nlist {nlist} nprobe {nprobe}'} | {batch} | "
                    f"{c:.3f} | {'—' if g is None else f'{g:.3f}'} | {'—' if g is None else f'{c / g:.1f}'} | "
                    f"{'—' if same is None else f'{same:.3f}'} |")
            cpu = gpu = None  # free the index (and its GPU memory) before the next
            print(f"  ({label} {kind}: built in {build:.1f} s)", flush=True)

    say("\n## 3. Map apply (the service's transform: CPU numpy) beside the same product on the GPU (torch)\n")
    cuda = torch_cuda()
    if cuda:
        import torch
    say("| batch | align apply (CPU) ms | GPU GEMM + normalise (torch) ms | CPU / GPU |")
    say("|---:|---:|---:|---:|")
    for batch in (1, 1024, 8192, 65536):
        X = unit(A[np.arange(batch) % A.shape[0]])
        c = timed(lambda X=X: m.apply(X), repeat=args.repeat)
        g = None
        if cuda:
            W = torch.as_tensor(np.ascontiguousarray(m.W, dtype=np.float32), device="cuda")

            def on_gpu(X=X, W=W):
                Y = torch.as_tensor(X).to("cuda", non_blocking=False) @ W
                Y = torch.nn.functional.normalize(Y, dim=1).cpu()
                return Y

            g = timed(on_gpu, repeat=args.repeat)
        say(f"| {batch} | {c:.3f} | {'—' if g is None else f'{g:.3f}'} | {'—' if g is None else f'{c / g:.1f}'} |")
    say("\n(GPU times include the copies to and from the GPU; CPU times use every core FAISS / BLAS was given.)")
    say.write(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
