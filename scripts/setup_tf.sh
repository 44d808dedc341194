#!/usr/bin/env bash
# Set up the TensorFlow environment: .venv-tf in the repo root with TensorFlow (CPU),
# Horovod built for TensorFlow (CPU only, gloo) and dpro (editable).
#
# Usage: scripts/setup_tf.sh [VENV]        (default: <repo>/.venv-tf)
#
# Kept apart from the PyTorch venv: TensorFlow and torch pin different numpy/protobuf
# ranges, and a Horovod build links against exactly one framework's C++ ABI.
#
# Idempotent: when VENV already holds this script's pinned set (a stamp file records the
# versions) it exits at once. The Horovod wheel is cached under
# $HOROVOD_WHEEL_CACHE/py<X.Y>-tf<version>/ (default ~/.cache/dpro/horovod-wheels), so only
# the first run builds it (~20-40 min on 2 cores: TensorFlow's headers are heavy); later
# runs, and fresh venvs, install the wheel in seconds.
#
# Why patches: there is no horovod wheel on PyPI and 0.28.1 (the last release) predates
# TF 2.21. We switch CMAKE_CXX_STANDARD 14 -> 17 (top-level and torch CMakeLists.txt, as
# scripts/install_horovod.sh does) and compile out horovod/tensorflow/xla_mpi_ops.cc (XLA
# custom-call ops for GPUs: its headers moved out of TF's tree); the build uses
# --no-build-isolation so it compiles against the TensorFlow installed in VENV.
#
# Environment: HOROVOD_WHEEL_CACHE, MAKEFLAGS (default -j2), SETUP_TF_FORCE=1 (redo all).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-tf}"
PY_BASE="${PY:-python3}"
TF_VERSION=2.21.0
HOROVOD_VERSION=0.28.1
CACHE_ROOT="${HOROVOD_WHEEL_CACHE:-$HOME/.cache/dpro/horovod-wheels}"
STAMP="$VENV/.dpro-setup-tf"
WANT="tensorflow-cpu==$TF_VERSION horovod==$HOROVOD_VERSION"

log() { printf '[setup_tf] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ "${SETUP_TF_FORCE:-0}" != "1" && -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    log "$VENV is set up ($WANT); nothing to do"
    exit 0
fi
start=$(date +%s)

if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    "$PY_BASE" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
PY="$VENV/bin/python"

log "installing tensorflow-cpu==$TF_VERSION and build/runtime dependencies"
"$PY" -m pip install -q "tensorflow-cpu==$TF_VERSION" \
    setuptools wheel cloudpickle psutil pyyaml packaging "cffi>=1.4.0"
log "installing dpro (editable)"
"$PY" -m pip install -q -e "$ROOT"

install_horovod() {
    local key cache whl
    key="$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}.{sys.version_info[1]}")')-tf$TF_VERSION"
    cache="$CACHE_ROOT/$key"
    mkdir -p "$cache"
    whl="$(ls -1 "$cache"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
    if [[ -n "$whl" ]]; then
        log "installing cached wheel $whl"
        "$PY" -m pip install -q --no-deps --force-reinstall "$whl"
        return
    fi
    command -v cmake >/dev/null 2>&1 || die "cmake not found (apt-get install cmake)"
    command -v "${CXX:-g++}" >/dev/null 2>&1 || die "C++ compiler ${CXX:-g++} not found"
    local workdir src
    workdir="$(mktemp -d "${TMPDIR:-/tmp}/horovod-tf-build.XXXXXX")"
    trap 'rm -rf "$workdir"' RETURN
    log "downloading horovod==$HOROVOD_VERSION sdist"
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$workdir" "horovod==$HOROVOD_VERSION"
    tar -xzf "$workdir/horovod-$HOROVOD_VERSION.tar.gz" -C "$workdir"
    src="$workdir/horovod-$HOROVOD_VERSION"
    local f
    for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
        grep -Eq '^[[:space:]]*set\(CMAKE_CXX_STANDARD 14\)[[:space:]]*$' "$src/$f" \
            || die "pattern 'set(CMAKE_CXX_STANDARD 14)' not found in $f (horovod version changed?)"
        sed -Ei 's/^([[:space:]]*)set\(CMAKE_CXX_STANDARD 14\)[[:space:]]*$/\1set(CMAKE_CXX_STANDARD 17)/' "$src/$f"
        log "patched $f: CMAKE_CXX_STANDARD 14 -> 17"
    done
    f=horovod/tensorflow/xla_mpi_ops.cc
    [[ "$(grep -c '^#if TENSORFLOW_VERSION >= 2006000000$' "$src/$f")" == 1 ]] \
        || die "XLA block guard not found in $f (horovod version changed?)"
    sed -i 's/^#if TENSORFLOW_VERSION >= 2006000000$/#if 0 \/\/ dpro: XLA ops compiled out (TF >= 2.16 moved the XLA headers)/' "$src/$f"
    log "patched $f: XLA ops compiled out"

    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
    export HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=GLOO
    export MAKEFLAGS="${MAKEFLAGS:--j2}"
    unset HOROVOD_GPU HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER \
          HOROVOD_GPU_BROADCAST HOROVOD_GPU_ALLTOALL HOROVOD_GPU_REDUCESCATTER
    local buildlog="$workdir/build.log"
    log "building horovod for tensorflow (MAKEFLAGS=$MAKEFLAGS); log: $buildlog"
    if ! "$PY" -m pip wheel -v --no-build-isolation --no-deps --no-cache-dir -w "$workdir/wheel" "$src" \
            >"$buildlog" 2>&1; then
        tail -n 60 "$buildlog" >&2
        cp "$buildlog" "${TMPDIR:-/tmp}/horovod-tf-build-failed.log"
        die "building horovod failed (log: ${TMPDIR:-/tmp}/horovod-tf-build-failed.log)"
    fi
    whl="$(ls -1 "$workdir"/wheel/horovod-"$HOROVOD_VERSION"-*.whl | head -n 1)"
    cp "$whl" "$cache/"
    log "wheel cached in $cache/$(basename "$whl")"
    "$PY" -m pip install -q --no-deps --force-reinstall "$cache/$(basename "$whl")"
}

if [[ "${SETUP_TF_FORCE:-0}" == "1" ]] || ! "$PY" -c "import horovod.tensorflow" >/dev/null 2>&1; then
    install_horovod
fi

"$PY" - <<'EOF' || die "the TensorFlow environment is installed but its check failed"
import tensorflow as tf
import horovod.tensorflow as hvd
import dpro
assert hvd.gloo_built(), "horovod.tensorflow was built without gloo"
print(f"[setup_tf] tensorflow {tf.__version__}, horovod {__import__('horovod').__version__} "
      f"(gloo={hvd.gloo_built()}), dpro {dpro.__file__}", flush=True)
EOF
echo "$WANT" >"$STAMP"
elapsed=$(( $(date +%s) - start ))
log "done in $((elapsed / 60)) min $((elapsed % 60)) s"
