# dpro developer entry points. `make demo` and `make test` set everything up from scratch.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Horovod wheels built here are cached (a rebuild takes minutes on 2 cores).
HOROVOD_WHEEL_CACHE ?= $(HOME)/.cache/dpro/horovod-wheels

.PHONY: setup horovod mxnet tf pslite browser demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned to the CPU build that pip finds locally on the dev/CI machines.
# pip install -e also builds the compiled replay core (setup.py) with the machine's C compiler.
setup: $(BIN)/python
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -e ".[test,ray]"
	$(MAKE) -s -C native/nccl_patch

# Horovod 0.28.1, CPU-only with gloo, built from its sdist (see scripts/install_horovod.sh).
horovod: setup
	HOROVOD_WHEEL_CACHE=$(HOROVOD_WHEEL_CACHE) scripts/install_horovod.sh $(BIN)/python

# MXNet 1.9.1 (dist kvstore over ps-lite) needs numpy < 1.24: its own venv, .venv-mx.
mxnet:
	scripts/setup_mxnet.sh $(PY)

# TensorFlow 2.21 (CPU) + Horovod for TF (gloo) + dpro in .venv-tf; the Horovod wheel is cached.
tf:
	PY=$(PY) HOROVOD_WHEEL_CACHE=$(HOROVOD_WHEEL_CACHE) MAKEFLAGS=-j2 scripts/setup_tf.sh

# ps-lite (from the BytePS 0.2.5.post15 sdist) with dpro's message trace; cached in ~/.cache/dpro/pslite.
pslite: setup
	native/pslite_patch/build.sh $(BIN)/python

# Debian's chromium, for the report's end-to-end test (tests/test_report_browser.py drives it
# with playwright) and benchmarks/report_open.py; installed with apt when missing (root, or sudo).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium; }

# The main job: replay the bundled real trace, then profile a live 2-rank DDP run, replay it
# and optimize it (strategy files in out/demo_strategy), and write both jobs' HTML reports (docs/report.md).
demo: setup
	$(BIN)/dpro replay examples/traces/ddp_gloo_2rank_mlp --timeline out/demo_bundled_timeline.json
	$(BIN)/dpro profile -o out/demo_trace --force -- $(BIN)/torchrun --nproc_per_node 2 \
		--master_addr 127.0.0.1 --master_port 29599 examples/pytorch/ddp_recorder.py --model mlp --bucket-cap-mb 10
	$(BIN)/dpro replay out/demo_trace --timeline out/demo_timeline.json
	$(BIN)/dpro optimize out/demo_trace -o out/demo_strategy --force --budget 20
	$(BIN)/dpro report examples/traces/ddp_gloo_2rank_mlp -o out/demo_bundled_report.html
	$(BIN)/dpro report out/demo_trace -o out/demo_report.html --optimize --budget 20 --png out/demo_report_png

test: setup horovod mxnet tf pslite browser
	@$(BIN)/python -c 'import dpro.replayer._core' || { echo "the compiled replay core did not build (see pip's output)"; exit 1; }
	@$(BIN)/python -c 'import dpro.importers.kineto._collect, dpro.importers.kineto._segments' || { echo "the compiled Kineto import loops did not build (see pip's output)"; exit 1; }
	$(BIN)/ruff check -q dpro tests benchmarks examples
	$(BIN)/python scripts/check_layers.py
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/replay_speed.py

clean:
	rm -rf $(VENV) .venv-mx .venv-tf out .pytest_cache
