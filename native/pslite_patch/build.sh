#!/usr/bin/env bash
# Build ps-lite (as bundled in BytePS's PyPI sdist) with dpro's message trace patch, and its
# test programs.  Idempotent; everything is cached under $DPRO_CACHE (~/.cache/dpro)/pslite:
#   src/byteps-<ver>.tar.gz          the sdist (pip download; it bundles ps-lite + zeromq-4.1.4)
#   zmq-4.1.4/                       zeromq built from the bundled tarball (no network)
#   build-<hash>/ps-lite/            patched ps-lite + tests/test_* (<hash>: this script + patch)
# A second run with nothing changed takes well under a second.  The last line printed is
#   PSLITE_DIR=<the ps-lite build directory>
# Exit codes: 0 built (or cached), 3 toolchain missing (a message says what), other: failure.
# Usage: build.sh [python]   (python with pip, used only to download the sdist once)
set -euo pipefail

BYTEPS_VERSION=0.2.5.post15
BYTEPS_SHA256=9d6a3c5be4c4b5a172739744bb32725c433f9a9f63794e1885e7376ff4eea99f
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${DPRO_CACHE:-$HOME/.cache/dpro}/pslite"
PY="${1:-${PYTHON:-python3}}"
JOBS="${PSLITE_JOBS:-2}"

for tool in g++ gcc make tar patch; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "dpro-pslite: toolchain missing: $tool not found" >&2
    exit 3
  fi
done

HASH="$(cat "$HERE/build.sh" "$HERE/pslite.patch" "$HERE/dpro_trace.h" | sha256sum | cut -c1-12)"
OUT="$CACHE/build-$HASH/ps-lite"
ZMQ="$CACHE/zmq-4.1.4"
if [[ -x "$OUT/tests/test_benchmark" && -f "$OUT/.dpro-built" ]]; then
  echo "PSLITE_DIR=$OUT"
  exit 0
fi

mkdir -p "$CACHE/src"
SDIST="$CACHE/src/byteps-$BYTEPS_VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
  echo "dpro-pslite: downloading byteps==$BYTEPS_VERSION (sdist) ..." >&2
  "$PY" -m pip download -q "byteps==$BYTEPS_VERSION" --no-deps --no-binary :all: -d "$CACHE/src" >&2
fi
echo "$BYTEPS_SHA256  $SDIST" | sha256sum -c --quiet - || { echo "dpro-pslite: $SDIST: checksum mismatch" >&2; exit 1; }

WORK="$(mktemp -d "$CACHE/.work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
tar -xzf "$SDIST" -C "$WORK" "byteps-$BYTEPS_VERSION/3rdparty/ps-lite" "byteps-$BYTEPS_VERSION/zeromq-4.1.4.tar.gz"
SRC="$WORK/byteps-$BYTEPS_VERSION"

# zeromq 4.1.4 from the bundled tarball (what ps-lite's make/deps.mk would wget).
if [[ ! -f "$ZMQ/include/zmq.h" || ! -f "$ZMQ/.dpro-built" ]]; then
  echo "dpro-pslite: building zeromq-4.1.4 (a few minutes on 2 cores) ..." >&2
  rm -rf "$ZMQ"
  tar -xzf "$SRC/zeromq-4.1.4.tar.gz" -C "$WORK"
  (cd "$WORK/zeromq-4.1.4" &&
    CFLAGS=-fPIC CXXFLAGS="-fPIC -Wno-error" nice -n 10 ./configure -q --prefix="$ZMQ" \
      --with-libsodium=no --with-libgssapi_krb5=no --without-documentation >"$WORK/zmq.log" 2>&1 &&
    nice -n 10 make -j"$JOBS" >"$WORK/zmq.log" 2>&1 && make install >>"$WORK/zmq.log" 2>&1) ||
    { tail -n 40 "$WORK/zmq.log" >&2; echo "dpro-pslite: building zeromq failed (log above)" >&2; exit 1; }
  touch "$ZMQ/.dpro-built"
fi

# ps-lite + the patch + the trace header; build the library and tests/test_*.
PSL="$SRC/3rdparty/ps-lite"
rm -f "$PSL/.git"
(cd "$PSL" && patch -p1 --quiet < "$HERE/pslite.patch")
cp "$HERE/dpro_trace.h" "$PSL/src/dpro_trace.h"
echo "dpro-pslite: building ps-lite + tests ..." >&2
if ! (cd "$PSL" && nice -n 10 make -j"$JOBS" DEPS_PATH="$ZMQ" ps test >"$WORK/make.log" 2>&1); then
  tail -n 40 "$WORK/make.log" >&2
  echo "dpro-pslite: building ps-lite failed (log above)" >&2
  exit 1
fi
rm -rf "$CACHE/build-$HASH"
mkdir -p "$CACHE/build-$HASH"
mv "$PSL" "$OUT"
# tests are linked with -rpath $ZMQ/lib, which stays where it is
touch "$OUT/.dpro-built"
for old in "$CACHE"/build-*; do [[ "$old" == "$CACHE/build-$HASH" ]] || rm -rf "$old"; done  # stale patch versions
echo "PSLITE_DIR=$OUT"
