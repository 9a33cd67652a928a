#!/usr/bin/env bash
# Issue 11's GPU check, in one call of the lent GPU machine (its python3 holds torch with CUDA; the service's own
# dependencies travel as wheels in .whl/, see /work/.library/device/README.md): the device tests of the service's
# GPU search (tests/service/indexes/test_device_search.py, `cuda` ones included) and benchmarks/bench_gpu.py.
# Writes pytest.log and gpu.md under $OUT (default ./gpu-out).
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
timeout 180 python3 -m pytest -q -p no:cacheprovider -rs tests/service/indexes/test_device_search.py 2>&1 \
  | tee "$OUT/pytest.log" | tail -n 25
timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_gpu.py --rows "${ROWS:-1000000}" --repeat 20 \
  --out "$OUT/gpu.md" 2>&1 | tee "$OUT/bench.log" | tail -n 40
