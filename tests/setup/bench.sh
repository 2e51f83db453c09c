#!/bin/bash
# tests/setup/bench.sh — on-demand expert fetch over loopback (make bench-setup).
# A synthetic snapshot with K3's real expert size (k3-lab synth --real-experts: 17,547,264 B per
# expert) is served by nginx; a --stream install of it then fetches every expert on demand
# with k3's client (tests/setup/bench_fetch: k3_stream_read from N threads, as the store's
# reader threads do, each span checked and kept as a raw-span file with fdatasync), against the
# limit measured in the same run: curl fetching the same ranges with the same parallelism
# (N curl processes, keep-alive), once discarding the bytes (the loopback HTTP limit) and once
# writing one file per expert without fsync (HTTP + page cache). Requests per expert are
# counted from nginx's own access log. Prints a markdown table (best of REPEAT runs).
# Env: K3_BIN (./k3), K3_LAB_BIN (./k3-lab), BENCH_FETCH (build/bench_fetch), LAYERS (3), EXPERTS (16), REPEAT (2).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
HERE=$ROOT/tests/setup
K3=$(readlink -f "${K3_BIN:-./k3}")
LAB=$(readlink -f "${K3_LAB_BIN:-./k3-lab}")
BF=$(readlink -f "${BENCH_FETCH:-build/bench_fetch}")
NGINX=$(command -v nginx || true)
[ -z "$NGINX" ] && [ -x /usr/sbin/nginx ] && NGINX=/usr/sbin/nginx
for tool in "$NGINX" curl python3; do
    command -v "$tool" >/dev/null || { echo "SKIPPED bench-setup: ${tool:-nginx} is missing"; exit 0; }
done
T0=$(mktemp -d /tmp/k3-setup-bench.XXXXXX)
"$LAB" synth "$T0/src" --layers "${LAYERS:-3}" --experts "${EXPERTS:-16}" --real-experts >/dev/null 2>&1 ||
    { echo "bench-setup: k3-lab synth failed"; rm -rf "$T0"; exit 1; }
SRC=$T0/src
source "$HERE/lib.sh"
trap 'cleanup; rm -rf "$T0"' EXIT
start_nginx
REPO=moonshotai/Kimi-K3/resolve/main
cat "$SRC"/*.safetensors > /dev/null # both sides read from the page cache
python3 - "$SRC" > "$T/ranges" <<'PY'
import json, os, re, struct, sys
src = sys.argv[1]
spans = {}
for s in sorted(f for f in os.listdir(src) if f.endswith(".safetensors")):
    with open(os.path.join(src, s), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    for name, e in h.items():
        m = re.search(r"layers\.(\d+)\..*\.experts\.(\d+)\.", name)
        if m:
            a, b = (8 + n + x for x in e["data_offsets"])
            k = (s,) + m.groups()
            lo, hi = spans.get(k, (a, b))
            spans[k] = (min(lo, a), max(hi, b))
for (s, l, x), (a, b) in sorted(spans.items()):
    print(s, a, b - 1)
PY
N=$(wc -l < "$T/ranges")
BYTES=$(awk '{t += $3 - $2 + 1} END {print t}' "$T/ranges")
best() { sort -g | tail -1; }
calc() { awk "BEGIN { print $* }"; }
# curl_run TH OUT: N parallel curl processes over the ranges (keep-alive within each);
# OUT "files" writes one file per expert (page cache, no fsync), "null" discards. Prints GB/s.
curl_run() {
    local th=$1 out=$2 i t0 t1 got cpids=()
    rm -rf "$T/curl" && mkdir -p "$T/curl"
    for i in $(seq 0 $((th - 1))); do
        awk -v th=$th -v i=$i -v ep="$EP" -v repo="$REPO" -v dir="$T/curl" -v out=$out \
            'NR % th == i { if (n++) print "next"
                            printf "url = \"%s/%s/%s\"\nrange = \"%s-%s\"\n", ep, repo, $1, $2, $3
                            printf "output = \"%s\"\n", out == "null" ? "/dev/null" : dir "/" NR ".bin" }' \
            "$T/ranges" > "$T/curl/cfg$i"
    done
    t0=$(date +%s.%N)
    for i in $(seq 0 $((th - 1))); do curl -s -f -K "$T/curl/cfg$i" & cpids+=($!); done
    wait "${cpids[@]}" || { echo "curl failed" >&2; return 1; } # not nginx
    t1=$(date +%s.%N)
    if [ $out = files ]; then
        got=$(cat "$T/curl"/*.bin | wc -c)
        [ "$got" = "$BYTES" ] || { echo "curl fetched $got of $BYTES bytes" >&2; return 1; }
    fi
    rm -rf "$T/curl"
    calc "$BYTES / ($t1 - $t0) / 1e9"
}
echo "| threads | experts | MB | curl -> /dev/null GB/s | curl -> files GB/s | k3 GB/s | k3 / curl -> files | requests per expert (nginx log) |"
echo "|---|---|---|---|---|---|---|---|"
for TH in 1 4; do
    null_best=0 files_best=0 k3_best=0 rpe=""
    for rep in $(seq "${REPEAT:-2}"); do
        null_best=$(printf '%s\n%s\n' "$null_best" "$(curl_run $TH null)" | best)
        files_best=$(printf '%s\n%s\n' "$files_best" "$(curl_run $TH files)" | best)
        rm -rf "$T/dest"
        "$K3" setup "$T/dest" --stream --endpoint "$EP" --connections $TH 2>/dev/null ||
            { echo "k3 setup --stream failed"; exit 1; }
        before=$(wc -l < "$T/ng/access.log")
        read n bytes secs gbs req rpe_self < <("$BF" "$T/dest" $TH) || { echo "bench_fetch failed"; exit 1; }
        reqs=$(tail -n +$((before + 1)) "$T/ng/access.log" | grep -c ' 206 ')
        [ "$bytes" = "$BYTES" ] || { echo "k3 fetched $bytes of $BYTES bytes"; exit 1; }
        k3_best=$(printf '%s\n%s\n' "$k3_best" "$gbs" | best)
        rpe=$(calc "$reqs / $n")
    done
    printf '| %d | %d | %.0f | %.2f | %.2f | %.2f | %.0f%% | %s |\n' $TH $N "$(calc "$BYTES / 1e6")" \
        "$null_best" "$files_best" "$k3_best" "$(calc "100 * $k3_best / $files_best")" "$rpe"
done
