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

.PHONY: install workbook test lab clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@# torch first, so the package's range is already satisfied and pip never picks a CUDA build by itself.
	$(VPY) -c "import torch" 2>/dev/null \
	  || $(VPY) -m pip install --no-index torch==$(TORCH_VERSION) 2>/dev/null \
	  || { if command -v nvidia-smi >/dev/null 2>&1; then $(VPY) -m pip install torch==$(TORCH_VERSION); \
	       else $(VPY) -m pip install torch==$(TORCH_VERSION) --index-url $(TORCH_CPU_INDEX); fi; }
	$(VPY) -m pip install -e ".[dev]"
	touch $@

workbook: install
	$(VPY) -m launch workbook --out $(RUNS)

test: install
	$(VPY) -m pytest

lab: install
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --no-browser $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) notebooks

clean:
	rm -rf $(VENV) $(RUNS) .pytest_cache
