# dpro developer entry points. `make demo` and `make test` set everything up from scratch.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: setup demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned to the CPU build that pip finds locally on the dev/CI machines.
setup: $(BIN)/python
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -e ".[test]"

demo: setup
	$(BIN)/dpro replay examples/traces/ddp_gloo_2rank_mlp --timeline out/demo_timeline.json

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/replay_speed.py

clean:
	rm -rf $(VENV) out .pytest_cache
