#!/usr/bin/env bash
# Issue 11's GPU check, in one call of the lent GPU machine (its python3 holds torch with CUDA; the service's own
# dependencies travel as wheels in .whl/, see /work/.library/device/README.md):
#   1. the index tests with every flat search on the GPU (VECBRIDGE_TEST_SEARCH_DEVICE=cuda, tests/conftest.py),
#   2. the device tests of the GPU search (tests/service/indexes/test_device_search.py, the `cuda` ones included),
#   3. benchmarks/bench_gpu.py (FAISS CPU beside the GPU search; BENCH_GPU=0 skips it),
#   4. benchmarks/bench_gpu_service.py (a CPU server beside a GPU server over HTTP; SERVICE_ROWS rows).
# Writes its logs and reports under $OUT (default ./gpu-out).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi -L
python3 -c "import torch, faiss; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'faiss', faiss.__version__)"
VECBRIDGE_TEST_SEARCH_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadfile \
  tests/service/indexes 2>&1 | tee "$OUT/pytest_indexes_cuda.log" | tail -n 8
timeout 180 python3 -m pytest -q -p no:cacheprovider -rs tests/service/indexes/test_device_search.py 2>&1 \
  | tee "$OUT/pytest.log" | tail -n 8
if [ "${BENCH_GPU:-1}" != 0 ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_gpu.py --rows "${ROWS:-1000000}" --repeat 20 \
    --out "$OUT/gpu.md" 2>&1 | tee "$OUT/bench.log" | tail -n 40
fi
timeout 240 python3 benchmarks/bench_gpu_service.py --rows "${SERVICE_ROWS:-1000000}" --blas-threads 0 --calls 10 \
  --rounds 2 --out "$OUT/gpu_service.md" 2>&1 | tee "$OUT/service.log" | tail -n 20
