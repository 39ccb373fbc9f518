# Two commands do everything on a fresh machine with Python 3.11, 3.12 or 3.13 (PYTHON=... picks one):
#   make workbook   set up .venv, run the workbook headless
#   make test       set up .venv, run the whole test suite
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Used only when no CUDA driver is found and no local torch wheel satisfies TORCH_VERSION.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
RUNS ?= runs

.PHONY: install workbook lint test test-fast test-torchtitan lab clean docs

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	@# Seconds, before any download: a Python that constraints.txt supports, with venv and pip.
	@test -x $(VPY) || command -v $(PYTHON) >/dev/null \
	  || { echo "make: PYTHON=$(PYTHON) is not a command here; give a path, e.g. PYTHON=/usr/bin/python3.12" >&2; exit 1; }
	@$$(test -x $(VPY) && echo $(VPY) || echo $(PYTHON)) tools/preflight.py
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@# torch first and alone, its build chosen here (a plain `pip install torch` on Linux pulls a CUDA
	@# build of several GB); its dependencies are pinned in constraints.txt.
	$(VPY) -c "import torch" 2>/dev/null \
	  || $(VPY) -m pip install --no-index --no-deps torch==$(TORCH_VERSION) 2>/dev/null \
	  || if command -v nvidia-smi >/dev/null 2>&1; then $(VPY) -m pip install -c constraints.txt torch==$(TORCH_VERSION); \
	     else $(VPY) -m pip install --no-deps --timeout 30 --retries 1 torch==$(TORCH_VERSION) --index-url $(TORCH_CPU_INDEX); fi \
	  || { echo "make: no torch $(TORCH_VERSION) for $$($(VPY) -V): no local wheel (pip's find-links) and the CPU index" \
	       "$(TORCH_CPU_INDEX) failed (pip's error above). Make it reachable (or TORCH_CPU_INDEX=a mirror), or install" \
	       "torch into $(VENV) yourself (README, How torch gets installed), then run make again." >&2; exit 1; }
	@# Exact versions, no resolver: constraints.txt lists every dependency, pip check proves it.
	$(VPY) -m pip install --no-deps -r constraints.txt
	$(VPY) -m pip install --no-deps --no-build-isolation -e .
	$(VPY) -m pip check || { echo "make: constraints.txt is incomplete or inconsistent for $$($(VPY) -V) (pip check above)" >&2; exit 1; }
	touch $@

workbook: install
	$(VPY) -m launch workbook --out $(RUNS)

# The generated parts of docs/ (the recipe table, ...) rewritten from the code; the tests only compare.
docs: install
	$(VPY) tools/regenerate_docs.py

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

# Our fully_shard inside torchtitan's own parallelize (tests/test_drop_in_torchtitan.py): torchtitan is not
# part of `make test`, as what its code imports is ~1 GB (triton) and its launch takes minutes on 2 cores.
# Installed beside .venv (pip --target), so .venv's own `pip check` never sees torchtitan's missing extras.
test-torchtitan: install
	test -f .torchtitan/.installed || { $(VPY) -m pip install --no-deps --target .torchtitan -r constraints-torchtitan.txt \
	  && touch .torchtitan/.installed; }
	PYTHONPATH=$(CURDIR)/.torchtitan $(VPY) -m pytest tests/test_drop_in_torchtitan.py -rs

lab: install
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --no-browser $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) notebooks

clean:
	rm -rf $(VENV) $(RUNS) .pytest_cache .torchtitan
