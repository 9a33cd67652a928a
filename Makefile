# Two commands on a fresh machine:  `make run`  (service on the embedded default)  and  `make test`.
PY ?= python3
PIP ?= $(PY) -m pip
DATA_DIR ?= ./var
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1

.PHONY: install install-dev run test bench

# torch first, pinned to the local CPU wheel, so nothing pulls a multi-GB CUDA build.
install:
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[service,encoders]'

install-dev: install
	$(PIP) install -q -e '.[service,encoders,vectordb,ray,lm,dev]'

run: install
	vecbridge serve --data-dir $(DATA_DIR)

test: install-dev
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/bench_align.py
