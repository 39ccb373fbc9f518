# Two commands do everything on a fresh machine with Python 3.11 and pip:
#   make workbook   set up .venv, run the workbook headless
#   make test       set up .venv, run the whole test suite
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Used only when no CUDA driver is found and no local torch wheel satisfies TORCH_VERSION.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
RUNS ?= runs

.PHONY: install workbook lint test test-fast lab clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@# torch first, so the package's range is already satisfied and pip never picks a CUDA build by itself.
	$(VPY) -c "import torch" 2>/dev/null \
	  || { $(VPY) -m pip install --no-index --no-deps torch==$(TORCH_VERSION) 2>/dev/null \
	       && $(VPY) -m pip install torch==$(TORCH_VERSION); } \
	  || { if command -v nvidia-smi >/dev/null 2>&1; then $(VPY) -m pip install torch==$(TORCH_VERSION); \
	       else $(VPY) -m pip install torch==$(TORCH_VERSION) --index-url $(TORCH_CPU_INDEX); fi; }
	@# The versions verified with the suite (constraints.txt) within the ranges of pyproject.toml.
	$(VPY) -m pip install -c constraints.txt -e ".[dev]"
	touch $@

workbook: install
	$(VPY) -m launch workbook --out $(RUNS)

# ruff (lint + format check) and the import contracts of pyproject.toml: a layering breach or an
# import circle fails here, before any test runs.
lint: install
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .
	$(VENV)/bin/lint-imports

test: lint
	$(VPY) -m pytest

# The tests that start no workers (under a minute here): for quick loops while editing.
test-fast: lint
	$(VPY) -m pytest -m "not distributed"

lab: install
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --no-browser $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) notebooks

clean:
	rm -rf $(VENV) $(RUNS) .pytest_cache
