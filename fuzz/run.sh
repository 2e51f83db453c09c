#!/bin/sh
# run.sh NAME... — runs each libFuzzer harness build-fuzz/fuzz_NAME for FUZZ_SECONDS (default
# 60) on a working copy of its seed corpus (fuzz/corpus/NAME, plus the regression inputs), and
# prints one line per harness: executions, corpus size, crashes. A crash's input is kept in
# build-fuzz/crashes/ (copy it to fuzz/regress/NAME/ with the fix). Exit 1 when any crashed.
set -u
cd "$(dirname "$0")/.."
SECS=${FUZZ_SECONDS:-60}
mkdir -p build-fuzz/crashes build-fuzz/logs
base=/dev/shm; [ -d "$base" ] || base=/tmp
K3_FUZZ_TMP=$(mktemp -d "$base/k3fuzz.XXXXXX") || exit 1
export K3_FUZZ_TMP
trap 'rm -rf "$K3_FUZZ_TMP"' EXIT
status=0
for name in "$@"; do
    work=build-fuzz/corpus/$name
    mkdir -p "$work"
    for d in fuzz/corpus/$name fuzz/regress/$name; do
        [ -d "$d" ] && cp -n "$d"/* "$work"/ 2>/dev/null
    done
    log=build-fuzz/logs/$name.log
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        build-fuzz/fuzz_"$name" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/"$name"- "$work" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    crashes=$(ls build-fuzz/crashes/ 2>/dev/null | grep -c "^$name-")
    printf '%-12s %10s execs in %ss, corpus %s, exit %s, crash files %s\n' "$name" \
        "${execs:-?}" "$SECS" "$(ls "$work" | wc -l)" "$rc" "$crashes"
    if [ "$rc" != 0 ]; then
        status=1
        grep -m3 -E 'ERROR|runtime error|oracle failed|SUMMARY' "$log" | sed 's/^/    /'
    fi
done
exit $status
