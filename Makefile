# Two commands do all the set-up on a fresh machine:
#   make demo   installs into .venv and runs the main example (CPU, ~15 min)
#   make test   installs into .venv and runs the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is pinned in the same pip command as everything that depends on it, so pip
# never pulls a multi-GB CUDA build on a CPU machine. On GPUs install torch first.
TORCH ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" -e ".[dev]"
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/agentrl train examples/arithmetic_tiny.yaml

test: install
	$(PY) -m pytest -q -ra

.PHONY: install demo test
