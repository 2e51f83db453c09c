#!/bin/sh
# Regenerates the real-width fixture model k3-wide from ../shared (7.1 GB, ~20 s) into a
# scratch folder and checks the engine against its reference outputs.
# Usage: scripts/test-wide.sh [TEST_BINARY]. Prints a visible SKIPPED line (exit 0) when
# ../shared, numpy or the disk space is missing; never passes silently.
set -u
BIN=${1:-build/k3_tests}
SHARED=${K3_SHARED:-../shared}
GEN="$SHARED/tools/make_k3_wide.py"
REF="$SHARED/fixtures/k3-wide/reference"
PY=/usr/bin/python3
SCRATCH=${K3_WIDE_SCRATCH:-${TMPDIR:-/tmp}/k3-wide-test}
NEED_KB=$((7300 * 1024))

skip() { echo "SKIPPED test-wide: $*"; exit 0; }
[ -f "$GEN" ] || skip "no generator at $GEN (needs the shared folder beside the repo)"
[ -d "$REF" ] || skip "no reference outputs at $REF"
[ -x "$PY" ] && "$PY" -c 'import numpy' 2>/dev/null || skip "$PY with numpy is missing (apt-get install python3-numpy)"

if ! "$PY" "$GEN" --check "$SCRATCH/k3-wide" >/dev/null 2>&1; then
    rm -rf "$SCRATCH"
    mkdir -p "$SCRATCH" || skip "cannot create $SCRATCH"
    FREE_KB=$(df -Pk "$SCRATCH" | awk 'NR==2 {print $4}')
    [ "$FREE_KB" -ge "$NEED_KB" ] || { rmdir "$SCRATCH"; skip "only $((FREE_KB / 1024)) MB free in $SCRATCH, need 7300 MB"; }
    echo "test-wide: generating k3-wide into $SCRATCH/k3-wide"
    "$PY" "$GEN" "$SCRATCH/k3-wide" || { echo "test-wide: generator failed"; exit 1; }
fi
K3_WIDE_DIR="$SCRATCH/k3-wide" K3_WIDE_REF="$REF" "$BIN" wide widestore prefillwide spinewide multistep
