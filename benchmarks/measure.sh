#!/bin/sh
# Run one measuring command alone and first on this shared machine:
#  - one measurement at a time (an exclusive lock on /tmp/dpro-measure.lock: others wait);
#  - in its own session, so its own autogroup, given the group nice -19 (root only), so that
#    other sessions' work only gets the CPU it leaves idle (see benchmarks/whatif/boost.py).
# Usage: benchmarks/measure.sh CMD [ARGS...]
exec flock /tmp/dpro-measure.lock setsid -w sh -c 'echo -19 > /proc/self/autogroup 2>/dev/null || echo "measure.sh: not root, not boosted" >&2; exec "$@"' sh "$@"
