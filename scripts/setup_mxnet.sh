#!/usr/bin/env bash
# Create .venv-mx: MXNet 1.9.1 (built with ps-lite / DIST_KVSTORE) + dpro editable.
#
# Usage: scripts/setup_mxnet.sh [PYTHON]     (default python3; run from anywhere)
#
# MXNet 1.9.1 (the last 1.x release) needs numpy < 1.24 (it uses np.bool etc.), while
# dpro's own venv follows numpy 2.x, so MXNet gets its own venv in the repo root.
# Idempotent: exits at once when .venv-mx already imports mxnet 1.9.1 and dpro.
# Environment: MX_VENV=DIR (default <repo>/.venv-mx), SETUP_MXNET_FORCE=1 to reinstall.
set -euo pipefail

PY="${1:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MX_VENV:-$ROOT/.venv-mx}"
MXNET_VERSION="1.9.1"

log() { printf '[setup_mxnet] %s\n' "$*" >&2; }

check() {
    "$VENV/bin/python" - <<PYEOF >/dev/null 2>&1
import mxnet, dpro, cvxpy, numpy
assert mxnet.__version__ == "$MXNET_VERSION", mxnet.__version__
assert mxnet.runtime.Features().is_enabled("DIST_KVSTORE")
import dpro.profiler.mxnet.backend
PYEOF
}

if [[ "${SETUP_MXNET_FORCE:-0}" != "1" && -x "$VENV/bin/python" ]] && check; then
    log "$VENV ready (mxnet $MXNET_VERSION, dpro editable); nothing to do"
    exit 0
fi

start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# numpy is pinned below 1.24 in the same resolve so dpro's deps (cvxpy, scipy, ...) are
# resolved against it rather than pulling numpy 2.
"$VENV/bin/pip" install -q "mxnet==$MXNET_VERSION" "numpy>=1.23,<1.24" "scipy<1.14"
"$VENV/bin/pip" install -q "numpy>=1.23,<1.24" "scipy<1.14" -e "$ROOT[test]"
check || { log "ERROR: $VENV built but the import check failed"; "$VENV/bin/python" -c "import mxnet, dpro"; exit 1; }
log "done in $(( $(date +%s) - start )) s: $VENV"
