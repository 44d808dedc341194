#!/usr/bin/env bash
# Build and install Horovod (PyTorch only, CPU only, gloo) from its sdist.
#
# Usage: scripts/install_horovod.sh [PYTHON]
#
#   PYTHON  the interpreter whose environment receives Horovod (default: python3);
#           torch must already be installed there.
#
# Idempotent: exits at once if `PYTHON -c "import horovod.torch"` already works.
#
# Why a source build with patches: there is no horovod wheel on PyPI, and horovod 0.28.1
# (the last release) compiles its torch extension as C++14, while torch >= 2.1 headers
# need C++17. We switch CMAKE_CXX_STANDARD 14 -> 17 in the top-level CMakeLists.txt and
# in horovod/torch/CMakeLists.txt, and build with --no-build-isolation so the extension
# is compiled against the torch already installed in PYTHON's environment.
#
# Needs: cmake >= 3.13, a C++17 compiler (g++), network access to PyPI.
# Takes ~10 min on 2 cores (the C++ build dominates). Environment:
#   HOROVOD_WHEEL_CACHE=DIR  keep the built wheel in DIR/py<X.Y>-torch<version>/ and, when
#                            one is there already, install it instead of building (seconds;
#                            for CI caches). The key includes the torch version because the
#                            extension is built against torch's C++ ABI.
#   INSTALL_HOROVOD_FORCE=1  (re)install even if horovod.torch is already importable
#   HOROVOD_VERSION          default 0.28.1; the patches are checked, so another version
#                            fails loudly if they no longer apply
#   MAKEFLAGS                default -j$(nproc)
#   KEEP_BUILD_DIR=1         keep the temporary build directory (its path is printed)
set -euo pipefail

PY="${1:-python3}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"

log() { printf '[install_horovod] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v "$PY" >/dev/null 2>&1 || die "python interpreter not found: $PY"

if [[ "${INSTALL_HOROVOD_FORCE:-0}" != "1" ]] && "$PY" -c "import horovod.torch" >/dev/null 2>&1; then
    log "horovod.torch already importable with $PY ($("$PY" -c 'import horovod; print(horovod.__version__)')); nothing to do"
    exit 0
fi

"$PY" -c "import torch" >/dev/null 2>&1 || die "torch is not importable with $PY; install torch first"

start=$(date +%s)
finish() {
    "$PY" - <<'EOF' || die "horovod installed but the check failed"
import horovod.torch as hvd
assert hvd.gloo_built(), "horovod.torch was built without gloo"
print(f"[install_horovod] horovod {__import__('horovod').__version__}: "
      f"gloo={hvd.gloo_built()} mpi={hvd.mpi_built()}", flush=True)
EOF
    local elapsed=$(( $(date +%s) - start ))
    log "done in $((elapsed / 60)) min $((elapsed % 60)) s"
}

# Horovod's runtime deps plus what setup.py needs at build time (setup_requires is not
# honoured with --no-build-isolation, so install them up front).
log "installing dependencies"
"$PY" -m pip install -q setuptools wheel cloudpickle psutil pyyaml packaging "cffi>=1.4.0"

cache=""
if [[ -n "${HOROVOD_WHEEL_CACHE:-}" ]]; then
    key="$("$PY" -c 'import sys, torch; print(f"py{sys.version_info[0]}.{sys.version_info[1]}-torch{torch.__version__}")')"
    cache="$HOROVOD_WHEEL_CACHE/$key"
    mkdir -p "$cache"
    whl="$(ls -1 "$cache"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
    if [[ -n "$whl" ]]; then
        log "installing cached wheel $whl"
        "$PY" -m pip install -q --no-deps --force-reinstall "$whl"
        finish
        exit 0
    fi
fi

command -v cmake >/dev/null 2>&1 || die "cmake not found (apt-get install cmake, or pip install cmake)"
command -v "${CXX:-g++}" >/dev/null 2>&1 || die "C++ compiler ${CXX:-g++} not found (apt-get install g++)"

workdir="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
if [[ "${KEEP_BUILD_DIR:-0}" == "1" ]]; then
    log "build directory (kept): $workdir"
else
    trap 'rm -rf "$workdir"' EXIT
fi

log "downloading horovod==$HOROVOD_VERSION sdist"
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$workdir" "horovod==$HOROVOD_VERSION"
sdist="$workdir/horovod-$HOROVOD_VERSION.tar.gz"
[[ -f "$sdist" ]] || die "sdist not found after download: $sdist"
tar -xzf "$sdist" -C "$workdir"
src="$workdir/horovod-$HOROVOD_VERSION"

# patch_cxx17 FILE: replace the line `set(CMAKE_CXX_STANDARD 14)` by 17; fail if absent.
patch_cxx17() {
    local f="$src/$1"
    [[ -f "$f" ]] || die "patch target missing: $1"
    grep -Eq '^[[:space:]]*set\(CMAKE_CXX_STANDARD 14\)[[:space:]]*$' "$f" \
        || die "pattern 'set(CMAKE_CXX_STANDARD 14)' not found in $1 (horovod version changed?)"
    sed -Ei 's/^([[:space:]]*)set\(CMAKE_CXX_STANDARD 14\)[[:space:]]*$/\1set(CMAKE_CXX_STANDARD 17)/' "$f"
    if grep -Eq '^[[:space:]]*set\(CMAKE_CXX_STANDARD 14\)' "$f"; then
        die "patch did not apply to $1"
    fi
    log "patched $1: CMAKE_CXX_STANDARD 14 -> 17"
}
patch_cxx17 CMakeLists.txt
patch_cxx17 horovod/torch/CMakeLists.txt

# CPU-only, gloo-only, PyTorch-only build. HOROVOD_CPU_OPERATIONS is compared
# case-sensitively by Horovod's CMakeLists.txt: it must be "GLOO" (lower case is
# silently ignored; gloo is the default anyway without MPI).
export HOROVOD_WITH_PYTORCH=1
export HOROVOD_WITHOUT_TENSORFLOW=1
export HOROVOD_WITHOUT_MXNET=1
export HOROVOD_WITHOUT_MPI=1
export HOROVOD_WITH_GLOO=1
export HOROVOD_CPU_OPERATIONS=GLOO
export MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
unset HOROVOD_GPU HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER \
      HOROVOD_GPU_BROADCAST HOROVOD_GPU_ALLTOALL HOROVOD_GPU_REDUCESCATTER

buildlog="$workdir/build.log"
log "building (MAKEFLAGS=$MAKEFLAGS); log: $buildlog"
build_failed() {
    tail -n 60 "$buildlog" >&2
    cp "$buildlog" "${TMPDIR:-/tmp}/horovod-build-failed.log" \
        && log "full log copied to ${TMPDIR:-/tmp}/horovod-build-failed.log"
    die "building horovod failed"
}
if [[ -n "$cache" ]]; then
    "$PY" -m pip wheel -v --no-build-isolation --no-deps --no-cache-dir -w "$workdir/wheel" "$src" \
        >"$buildlog" 2>&1 || build_failed
    whl="$(ls -1 "$workdir"/wheel/horovod-"$HOROVOD_VERSION"-*.whl | head -n 1)"
    cp "$whl" "$cache/"
    log "wheel cached in $cache/$(basename "$whl")"
    "$PY" -m pip install -q --no-deps --force-reinstall "$cache/$(basename "$whl")"
else
    "$PY" -m pip install -v --no-build-isolation --no-cache-dir "$src" >"$buildlog" 2>&1 || build_failed
fi
finish
