#!/bin/bash
# tests/setup/run.sh GROUP... — `k3 setup` against nginx on loopback, serving the k3-nano
# fixture under the Hugging Face hub layout, plus a fault-injecting proxy (faultproxy.py).
# Groups: full stream streamrun budget auto faults drip resume byname (default: all). Needs
# nginx and python3; says SKIPPED and the reason when one is missing (exit 0). Ends with
# "N passed, N failed"; exit 0 when every check passed.
# K3_BIN selects the binary (default ./k3); K3_KEEP_TMP=1 keeps the temp folder.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
K3=$(readlink -f "${K3_BIN:-./k3}")
# the test build (make build/k3-test: -DK3_TEST_CONTROLS) for the checks that fake the free
# disk space (K3_SETUP_FREE_BYTES); the shipped k3 reads no test variable
K3T=$(readlink -f "${K3_TEST_BIN:-./build/k3-test}")
FIX=$ROOT/tests/fixtures/k3-nano
HERE=$ROOT/tests/setup
NGINX=$(command -v nginx || true)
[ -z "$NGINX" ] && [ -x /usr/sbin/nginx ] && NGINX=/usr/sbin/nginx
if [ -z "$NGINX" ]; then
    echo "SKIPPED test-setup: nginx is not installed (./scripts/install-deps.sh installs it)"; exit 0
fi
if ! command -v python3 >/dev/null; then echo "SKIPPED test-setup: python3 is not installed"; exit 0; fi
[ -x "$K3" ] || { echo "FAIL: no k3 binary at $K3"; exit 1; }

source "$HERE/lib.sh"

FAILS=0 PASSES=0
pass() { echo "ok    $*"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL  $*"; FAILS=$((FAILS + 1)); }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
META="config.json generation_config.json model.safetensors.index.json tiktoken.model tokenizer_config.json"
SHARDS=$(cd "$FIX" && ls model-*.safetensors)
same_as_source() { # DEST: every file byte-identical to the fixture, no temporary file left
    local d=$1 f
    for f in $META $SHARDS; do cmp -s "$FIX/$f" "$d/$f" || { echo "  differs: $d/$f"; return 1; }; done
    ! ls "$d" | grep -q '\.k3tmp$' && [ -z "$(ls "$d/.k3/partial")" ]
}
no_false_files() { # DEST: every file under its final name is identical to the source
    local d=$1 f
    for f in $META $SHARDS; do
        [ ! -e "$d/$f" ] || cmp -s "$FIX/$f" "$d/$f" || { echo "  corrupt: $d/$f"; return 1; }
    done
}

# ---- servers (nginx: lib.sh) -------------------------------------------------------------
start_proxy() { # on a port the system picks (a port found free first could be taken meanwhile)
    : > "$T/rules"; : > "$T/proxy.log"; : > "$T/proxy.port"
    python3 "$HERE/faultproxy.py" 0 "$NPORT" "$T/rules" "$T/proxy.log" >"$T/proxy.port" 2>"$T/proxy.err" &
    PIDS+=($!)
    PPORT=""
    for i in $(seq 300); do # it prints the port once it listens; up to 30 s on a loaded machine
        PPORT=$(head -n 1 "$T/proxy.port")
        [ -n "$PPORT" ] && break
        sleep 0.1
    done
    [ -n "$PPORT" ] || { echo "FAIL: the fault proxy did not start:"; cat "$T/proxy.err"; exit 1; }
    PEP="http://127.0.0.1:$PPORT"
    : > "$T/proxy.log"
}
# New rules, each set new to the proxy even when the same as the last (its counts start again):
# a first line unique to the call (the proxy compares the text; a comment to it), written whole
# and renamed into place, so that the proxy never reads half of it. (It used to compare the
# file's mtime and size after a 10 ms pause: no change seen when both fell in one clock tick.)
rules() { printf '%s\n' "# $(date +%s%N)" "$@" > "$T/rules.new" && mv "$T/rules.new" "$T/rules"; }
nginx_lines() { wc -l < "$T/ng/access.log"; }
setup() { "$K3" setup "$@" --backoff 0.05 --timeout 5; }
setup_t() { "$K3T" setup "$@" --backoff 0.05 --timeout 5; } # the test build
setup_bg() { ( exec "$K3" setup "$@" --backoff 0.05 --timeout 5 ) & } # $! is k3 itself

# ---- groups ----------------------------------------------------------------------------
group_full() {
    local d=$T/full rc
    setup "$d" --full --endpoint "$EP" 2>"$T/full.err"; rc=$?
    check "full: exit 0" [ $rc = 0 ]
    check "full: every file byte-identical to the source, no partial file left" same_as_source "$d"
    check "full: no journal left" bash -c "! ls '$d/.k3' | grep -q '\.done$'"
    check "full: pinned to the commit main points to" grep -q "\"revision\":[[:space:]]*\"$COMMIT\"" "$d/.k3/setup.json"
    check "full: shards fetched by commit, never by branch" bash -c "grep -q 'resolve/$COMMIT/model-' '$T/ng/access.log' && ! grep -q 'resolve/main/model-' '$T/ng/access.log'"
    check "full: --check passes" setup "$d" --check
    local before=$(nginx_lines)
    setup "$d" --full --endpoint "$EP" 2>/dev/null
    check "full: a second run fetches nothing" [ "$(nginx_lines)" = "$before" ]
    # --check catches a corrupt byte (same length; the server gave a sha256)
    local s=model-00005-of-000011.safetensors
    cp "$d/$s" "$T/keep"
    printf '\x5a' | dd of="$d/$s" bs=1 seek=5000 conv=notrunc 2>/dev/null
    setup "$d" --check >"$T/check.out" 2>&1; rc=$?
    check "full: --check fails (exit 5) on a flipped byte" [ $rc = 5 ]
    check "full: --check names the file" grep -q "BAD.*$s: sha256" "$T/check.out"
    cp "$T/keep" "$d/$s"
    # HF_TOKEN goes to the endpoint as a bearer token
    HF_TOKEN=sekrit-token setup "$T/tok" --stream --endpoint "$EP" 2>/dev/null
    check "full: HF_TOKEN sent as 'Authorization: Bearer'" grep -q '"Bearer sekrit-token"' "$T/ng/access.log"
}

group_stream() {
    local d=$T/stream rc n_exp
    setup "$d" --stream --endpoint "$EP" 2>"$T/stream.err"; rc=$?
    check "stream: exit 0" [ $rc = 0 ]
    check "stream: headers and spine identical, shards full length" python3 "$HERE/verify.py" stream-ok "$FIX" "$d"
    check "stream: expert shards stay partial, not under their name" bash -c "[ -e '$d/.k3/partial/model-00002-of-000011.safetensors' ] && [ ! -e '$d/model-00002-of-000011.safetensors' ]"
    check "stream: a spine-only shard is complete" cmp -s "$FIX/model-00010-of-000011.safetensors" "$d/model-00010-of-000011.safetensors"
    check "stream: says how to finish" grep -q "finishing costs .*--finish" "$T/stream.err"
    check "stream: --check passes" setup "$d" --check
    n_exp=$(python3 "$HERE/verify.py" experts "$FIX")
    check "stream: --check counts 0 of $n_exp experts local" bash -c "'$K3' setup '$d' --check 2>&1 | grep -q ' 0 of $n_exp experts local'"
    setup "$d" --finish 2>"$T/finish.err"; rc=$?
    check "finish: exit 0" [ $rc = 0 ]
    check "finish: byte-identical to the source" same_as_source "$d"
    check "finish: --check passes, all experts local" bash -c "'$K3' setup '$d' --check 2>&1 | grep -q '$n_exp of $n_exp experts local: ok'"
    # --finish copies raw spans instead of fetching them: fake a cached span from the source
    local d2=$T/stream2
    setup "$d2" --stream --endpoint "$EP" 2>/dev/null
    python3 -c "
import sys, os
src='$FIX'; dest='$d2'
exec(open('$HERE/verify.py').read().split('cmd = sys.argv[1]')[0])  # its header()
s='model-00003-of-000011.safetensors'
hb, ts = header(os.path.join(src, s))
span = [(a, b) for n, a, b, k in ts if k == 'expert' and '.experts.5.' in n]
a, b = min(x for x, _ in span), max(y for _, y in span)
os.makedirs(dest + '/.k3/experts/2', exist_ok=True)
open(dest + '/.k3/experts/2/5.bin', 'wb').write(open(os.path.join(src, s), 'rb').read()[a:b])
print(a, b - 1)" > "$T/span"
    local before=$(nginx_lines)
    setup "$d2" --finish 2>"$T/finish2.err"
    check "finish: identical with a raw span copied in" same_as_source "$d2"
    check "finish: reports the cached span" grep -q "1 of them in the raw-span cache" "$T/finish2.err"
    check "finish: the cached span was not fetched" bash -c "! tail -n +$((before + 1)) '$T/ng/access.log' | grep 'model-00003' | grep -q 'bytes=$(cut -d' ' -f1 < "$T/span")-'"
    check "finish: raw span removed once in the shard" [ ! -e "$d2/.k3/experts/2/5.bin" ]
}

# Streaming at run time: experts fetched on demand (one request each) give the same logits.
group_streamrun() {
    start_proxy
    local d=$T/sr rc ids=1792,100,200,300,1813,7 n_req n_bin
    "$K3" run "$FIX" --prompt-ids $ids --max-new 6 --ids --dump-logits "$T/local.bin" -q >"$T/local.ids" 2>/dev/null
    setup "$d" --stream --endpoint "$PEP" --retries 2 2>/dev/null
    : > "$T/proxy.log"
    export K3_PIPE=0 # no speculative prefetch: exactly the experts the router chose are fetched
    "$K3" run "$d" --prompt-ids $ids --max-new 6 --ids --dump-logits "$T/sr.bin" >"$T/sr.ids" 2>"$T/sr.err"; rc=$?
    check "streamrun: generation exit 0" [ $rc = 0 ]
    check "streamrun: logits bit-identical to the local snapshot" cmp -s "$T/local.bin" "$T/sr.bin"
    check "streamrun: same tokens" cmp -s "$T/local.ids" "$T/sr.ids"
    check "streamrun: startup says 0 experts local and how to finish" grep -q "streaming install: 0 of 256 experts local.*k3 setup $d --finish" "$T/sr.err"
    n_req=$(grep -c 'safetensors bytes=' "$T/proxy.log")
    n_bin=$(find "$d/.k3/experts" -name '*.bin' | wc -l)
    check "streamrun: one request per fetched expert ($n_req requests, $n_bin experts kept)" bash -c "[ $n_req = $n_bin ] && [ $n_bin -gt 0 ]"
    : > "$T/proxy.log"
    "$K3" run "$d" --prompt-ids $ids --max-new 6 --ids --dump-logits "$T/sr2.bin" >/dev/null 2>"$T/sr2.err"
    check "streamrun: a second run fetches nothing, same logits" bash -c "[ ! -s '$T/proxy.log' ] && cmp -s '$T/local.bin' '$T/sr2.bin'"
    check "streamrun: startup counts the kept experts" grep -q "streaming install: $n_bin of 256 experts local" "$T/sr2.err"
    # a reset mid-body and a 500 are retried; the answer is unchanged
    rm -rf "$d/.k3/experts"
    rules "reset model-00004 1" "status model-00006 1 500"
    "$K3" run "$d" --prompt-ids $ids --max-new 6 --ids --dump-logits "$T/sr3.bin" >/dev/null 2>&1; rc=$?
    check "streamrun: reset and 500 retried, same logits" bash -c "[ $rc = 0 ] && cmp -s '$T/local.bin' '$T/sr3.bin'"
    check "streamrun: the faults fired" bash -c "grep -q ' reset\$' '$T/proxy.log' && grep -q ' status\$' '$T/proxy.log'"
    # a persistent failure stops the run with the expert and the URL, and keeps nothing bad
    rm -rf "$d/.k3/experts"
    rules "badrange model-00005 -1"
    HF_TOKEN=sekrit-token "$K3" run "$d" --prompt-ids $ids --max-new 6 >/dev/null 2>"$T/sr4.err"; rc=$?
    check "streamrun: persistent wrong Content-Range -> exit 10" [ $rc = 10 ]
    check "streamrun: the error names the expert and the URL" grep -q "expert [0-9]* of layer 4: bytes [0-9]*-[0-9]* of $PEP/moonshotai/Kimi-K3/resolve/$COMMIT/model-00005-of-000011.safetensors: wrong Content-Range" "$T/sr4.err"
    check "streamrun: no token in the error" bash -c "! grep -q sekrit '$T/sr4.err'"
    check "streamrun: no raw span kept for layer 4" bash -c "[ -z \"\$(ls '$d/.k3/experts/4' 2>/dev/null)\" ]"
    rules ""
    # --finish copies what streaming kept and fetches the rest
    "$K3" run "$d" --prompt-ids $ids --max-new 6 >/dev/null 2>&1
    n_bin=$(find "$d/.k3/experts" -name '*.bin' | wc -l)
    setup "$d" --finish 2>"$T/srf.err"; rc=$?
    check "streamrun: --finish copies the $n_bin kept experts" grep -q "$n_bin of them in the raw-span cache" "$T/srf.err"
    check "streamrun: --finish ends byte-identical" same_as_source "$d"
    "$K3" run "$d" --prompt-ids $ids --max-new 6 --ids --dump-logits "$T/sr5.bin" >/dev/null 2>"$T/sr5.err"
    check "streamrun: the finished install runs as a plain snapshot" bash -c "cmp -s '$T/local.bin' '$T/sr5.bin' && ! grep -q 'streaming install' '$T/sr5.err'"
    unset K3_PIPE
}

# A disk budget for the experts a streaming run keeps (k3_stream_opts): the raw-span folder
# never exceeds it (replayed from an strace of k3's creates, renames and unlinks there,
# temporary files counted; SKIPPED without strace), evicted experts are
# fetched again when needed, and the logits stay bit-identical to the local snapshot.
experts_bytes() { # DEST: bytes of every file under DEST/.k3/experts
    find "$1/.k3/experts" -type f -printf '%s\n' 2>/dev/null | awk '{s += $1} END {print s + 0}'
}
run_traced() { # DEST OUT ERR TRACE ARGS...: k3 run under strace (its file creates, renames, unlinks)
    local d=$1 out=$2 errf=$3 tr=$4
    shift 4
    # LeakSanitizer cannot run under ptrace and fails the run at exit: an ASan build is
    # traced with leak checks off (the untraced runs of this group still check leaks).
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        strace -f -qq -o "$tr" -e trace=openat,rename,renameat,renameat2,unlink,unlinkat \
        "$K3" run "$d" "$@" >"$out" 2>"$errf"
}
group_budget() {
    start_proxy
    local d=$T/bud rc ids=1792,100,200,300,1813,7 span=1632 n_req n_uniq max budget left
    local args="--prompt-ids $ids --max-new 6 --ids"
    "$K3" run "$FIX" $args --dump-logits "$T/bl.bin" -q >"$T/bl.ids" 2>/dev/null
    setup "$d" --stream --endpoint "$PEP" 2>/dev/null
    export K3_PIPE=0
    budget=$((20 * span)) # 20 of the 181 experts this prompt uses (each span is 1632 bytes)
    : > "$T/proxy.log"
    if command -v strace >/dev/null && strace -f -qq -o /dev/null true 2>/dev/null; then
        run_traced "$d" "$T/b1.ids" "$T/b1.err" "$T/b1.trace" $args --dump-logits "$T/b1.bin" \
            --expert-disk-gb "$(awk "BEGIN {printf \"%.9f\", $budget / 1e9}")" --load-threads 4 \
            --expert-gb 0.00002; rc=$? # a RAM cache of a few experts: evicted ones are read again
        max=$(python3 "$HERE/verify.py" disk-trace "$FIX" "$T/b1.trace")
        check "budget: .k3/experts never above $budget bytes (at most $max by the trace)" bash -c "[ $max -le $budget ] && [ $max -ge $((budget / 2)) ]"
    else
        echo "SKIPPED budget: the size of .k3/experts over time (strace is missing or not allowed)"
        "$K3" run "$d" $args --dump-logits "$T/b1.bin" --load-threads 4 --expert-gb 0.00002 \
            --expert-disk-gb "$(awk "BEGIN {printf \"%.9f\", $budget / 1e9}")" >"$T/b1.ids" 2>"$T/b1.err"; rc=$?
    fi
    left=$(experts_bytes "$d")
    check "budget: $left bytes kept at the end, within the budget" [ $left -le $budget ]
    check "budget: generation exit 0" [ $rc = 0 ]
    check "budget: logits bit-identical to the local snapshot" cmp -s "$T/bl.bin" "$T/b1.bin"
    check "budget: same tokens" cmp -s "$T/bl.ids" "$T/b1.ids"
    check "budget: startup states the budget" grep -q "fetched experts on disk: 0 B of a 32.6 kB budget, least recently used evicted first" "$T/b1.err"
    n_req=$(grep -c 'safetensors bytes=' "$T/proxy.log")
    n_uniq=$(grep 'safetensors bytes=' "$T/proxy.log" | cut -d' ' -f1,2 | sort -u | wc -l)
    check "budget: evicted experts fetched again ($n_uniq experts, $n_req requests)" bash -c "[ $n_uniq -gt 20 ] && [ $n_req -gt $n_uniq ]"
    # a budget of 0 keeps nothing; a default run keeps everything, and a smaller budget
    # at the next open evicts down to it before anything is read
    "$K3" run "$d" $args --dump-logits "$T/b2.bin" --expert-disk-gb 0 >/dev/null 2>&1
    left=$(experts_bytes "$d")
    check "budget: 0 keeps nothing ($left bytes left), same logits" bash -c "[ $left = 0 ] && cmp -s '$T/bl.bin' '$T/b2.bin'"
    "$K3" run "$d" $args -q >/dev/null 2>&1
    check "budget: the default keeps every fetched expert" bash -c "[ \$(find '$d/.k3/experts' -name '*.bin' | wc -l) = $n_uniq ]"
    check "budget: the default is stated with its margin" bash -c "'$K3' run '$d' $args 2>&1 >/dev/null | grep -q 'of a .* budget (what leaves .* of the .* file system free: max(10%, min(20 GB, 25%))'"
    "$K3" run "$d" $args --dump-logits "$T/b3.bin" --expert-disk-gb 0.00001 >/dev/null 2>&1
    left=$(experts_bytes "$d")
    check "budget: shrunk at open: $left bytes left <= 10000, same logits" bash -c "[ $left -le 10000 ] && [ $left -gt 0 ] && cmp -s '$T/bl.bin' '$T/b3.bin'"
    unset K3_PIPE
}

group_auto() {
    local rc need_stream need_full
    check "the shipped k3 does not know K3_SETUP_FREE_BYTES" bash -c "! strings '$K3' | grep -q K3_SETUP_FREE_BYTES"
    check "the test build does" bash -c "strings '$K3T' | grep -q K3_SETUP_FREE_BYTES"
    read need_stream need_full < <(python3 "$HERE/verify.py" need "$FIX")
    K3_SETUP_FREE_BYTES=$need_full setup_t "$T/a1" --endpoint "$EP" 2>"$T/a1.err"
    check "auto: room for everything -> full" same_as_source "$T/a1"
    K3_SETUP_FREE_BYTES=$need_stream setup_t "$T/a2" --endpoint "$EP" 2>"$T/a2.err"; rc=$?
    check "auto: room for the spine only -> stream (exit 0)" [ $rc = 0 ]
    check "auto: stream chosen" grep -q '"mode":[[:space:]]*"stream"' "$T/a2/.k3/setup.json"
    check "auto: says how much a full install needs" grep -qF "not enough room for a full install ($((need_full - need_stream)) more bytes" "$T/a2.err"
    K3_SETUP_FREE_BYTES=$((need_stream - 1)) setup_t "$T/a3" --endpoint "$EP" 2>"$T/a3.err"; rc=$?
    check "auto: too little room -> exit 11" [ $rc = 11 ]
    check "auto: refuses with the exact amount to free (1 byte)" grep -q "needs $need_stream bytes .* free at least 1 bytes" "$T/a3.err"
    check "auto: nothing written before the refusal" bash -c "! ls '$T/a3' | grep -q safetensors"
    K3_SETUP_FREE_BYTES=1000 setup_t "$T/a4" --full --endpoint "$EP" 2>"$T/a4.err"; rc=$?
    check "--full without room -> exit 11 naming $((need_full - 1000)) bytes" bash -c "[ $rc = 11 ] && grep -q 'free at least $((need_full - 1000)) bytes' '$T/a4.err'"
}

# One fault on the way to a --full install: it must be retried and end byte-identical.
fault_retried() { # NAME RULE
    local d=$T/f-$1
    rules "$2"
    setup "$d" --full --endpoint "$PEP" --connections 2 2>"$T/f-$1.err"
    local rc=$?
    check "fault $1: retried, exit 0" [ $rc = 0 ]
    check "fault $1: byte-identical" same_as_source "$d"
    check "fault $1: the fault fired" grep -q " $(echo "$2" | cut -d' ' -f1)\$" "$T/proxy.log"
}

group_faults() {
    start_proxy
    local s=model-00004-of-000011.safetensors rc
    fault_retried reset "reset $s 1"
    fault_retried http500 "status $s 2 500"
    fault_retried truncate "truncate $s 1"
    fault_retried badrange-once "badrange $s 1"
    fault_retried stall "stall $s 1 3"
    fault_retried config500 "status config.json 1 503"
    # persistent faults: the clear error, exit 10, no corrupt file
    rules "badrange $s -1"
    HF_TOKEN=sekrit-token setup "$T/f-bad" --full --endpoint "$PEP" --retries 2 2>"$T/f-bad.err"; rc=$?
    check "wrong Content-Range: exit 10 after the retries" [ $rc = 10 ]
    check "wrong Content-Range: says so, names the URL" grep -q "wrong Content-Range.*gave up after 3 attempts" "$T/f-bad.err"
    check "wrong Content-Range: the URL is named" grep -q "$PEP/moonshotai/Kimi-K3/resolve/$COMMIT/$s" "$T/f-bad.err"
    check "retries: one line each, attempt 2 and 3 of 3 with the wait and the reason" bash -c \
        "[ \$(grep -c 'k3 setup: retrying .*/$s in [0-9.]* s (attempt [23] of 3): .*wrong Content-Range' '$T/f-bad.err') = 2 ] && grep -q 'attempt 3 of 3' '$T/f-bad.err'"
    check "errors never show the token" bash -c "! grep -q sekrit '$T/f-bad.err'"
    check "wrong Content-Range: no corrupt file" no_false_files "$T/f-bad"
    check "wrong Content-Range: the shard is not in place" [ ! -e "$T/f-bad/$s" ]
    rules ""
    setup "$T/f-bad" --full --endpoint "$PEP" 2>/dev/null
    check "wrong Content-Range: a later run completes" same_as_source "$T/f-bad"
    rules "status $s -1 404"
    setup "$T/f-404" --full --endpoint "$PEP" 2>"$T/f-404.err"; rc=$?
    check "404: exit 10, no retry" bash -c "[ $rc = 10 ] && grep -q 'HTTP 404.*(1 attempt)' '$T/f-404.err' && ! grep -q retrying '$T/f-404.err'"
    check "404: the URL is named" grep -q "resolve/$COMMIT/$s" "$T/f-404.err"
    check "404: no corrupt file" no_false_files "$T/f-404"
    rules "status generation_config.json -1 404"
    setup "$T/f-opt" --full --endpoint "$PEP" 2>/dev/null; rc=$?
    check "404 of the optional generation_config.json is fine" bash -c "[ $rc = 0 ] && [ ! -e '$T/f-opt/generation_config.json' ]"
    rules "truncate $s -1"
    setup "$T/f-trunc" --full --endpoint "$PEP" --retries 1 2>"$T/f-trunc.err"; rc=$?
    check "truncated body every time: exit 10, no corrupt file" bash -c "[ $rc = 10 ] && grep -q 'truncated body\|transfer closed' '$T/f-trunc.err'" 
    check "truncated body every time: nothing in place" bash -c "[ ! -e '$T/f-trunc/$s' ]"
    rules ""
    # wrong sha256 from the server: the shard is deleted, never renamed into place
    setup "$T/f-sha" --full --endpoint "$EP" --repo badsha/Kimi-K3 2>"$T/f-sha.err"; rc=$?
    check "sha256 mismatch: exit 10 and says so" bash -c "[ $rc = 10 ] && grep -q 'sha256 of the downloaded shard' '$T/f-sha.err'"
    check "sha256 mismatch: no file in place" bash -c "[ ! -e '$T/f-sha/model-00010-of-000011.safetensors' ] && [ ! -e '$T/f-sha/.k3/partial/model-00010-of-000011.safetensors' ]"
    # redirects: to the same host followed, to another host over http refused
    setup "$T/f-redir" --full --endpoint "$EP" --repo redirect/Kimi-K3 2>/dev/null; rc=$?
    check "redirect to the same host: followed" bash -c "[ $rc = 0 ]" && check "redirect: byte-identical" same_as_source "$T/f-redir"
    setup "$T/f-off" --full --endpoint "$EP" --repo offsite/Kimi-K3 2>"$T/f-off.err"; rc=$?
    check "redirect to another host over http: refused (exit 10)" bash -c "[ $rc = 10 ] && grep -q 'refused a redirect to http://localhost' '$T/f-off.err'"
}

# A hub that drips (3 bytes/s: never a second without a byte, so curl's no-byte timeout never
# fires): each attempt's deadline (--timeout plus its bytes at 16 KiB/s) retries it (issue 32).
# Bounded: the install is killed after 60 s (dripped, config.json alone would take 25 min).
group_drip() {
    start_proxy
    local rc
    rules "drip config.json 1 3"
    timeout 60 "$K3" setup "$T/f-drip" --full --endpoint "$PEP" --backoff 0.05 --timeout 5 2>"$T/f-drip.err"; rc=$?
    check "drip: retried at the deadline, exit 0 (not $rc)" [ $rc = 0 ]
    check "drip: byte-identical" same_as_source "$T/f-drip"
    check "drip: the retry says why" grep -q "retrying .*config.json.*no complete answer within 5 s" "$T/f-drip.err"
    rules ""
}

journaled() { # DEST: prints each shard's journaled byte count (or "all" when in place)
    local f
    for f in $SHARDS; do
        if [ -e "$1/$f" ]; then echo "$f=all"
        else echo "$f=$(python3 "$HERE/verify.py" journal "$1" "$f")"; fi
    done
}
wait_journaled() { # DEST SECONDS: until a shard's journal holds a range (the download is under
    local i          # way); no python in the loop: on a loaded machine 11 starts take seconds
    for ((i = 0; i < $2 * 20; i++)); do
        find "$1/.k3" -maxdepth 1 -name '*.done' -size +0c 2>/dev/null | grep -q . && return 0
        sleep 0.05
    done
    return 1
}
group_resume() {
    start_proxy
    local d=$T/resume rc pid
    # slow enough to be killed mid-download: 32 KiB requests at 256 KiB/s
    rules "slow safetensors -1 262144"
    setup_bg "$d" --full --endpoint "$PEP" --connections 1 --chunk-mb 0.03125 2>"$T/r1.err"
    pid=$!
    wait_journaled "$d" 60 # not a fixed sleep: a loaded machine (or an ASan build) starts late
    kill -9 $pid; wait $pid 2>/dev/null
    check "resume: killed mid-download left partial shards" bash -c "[ -n \"\$(ls '$d/.k3/partial')\" ]"
    check "resume: no file in place that is not complete" no_false_files "$d"
    local held=()
    mapfile -t held < <(journaled "$d")
    check "resume: some bytes were journaled" bash -c "echo '${held[*]}' | grep -q '=[0-9]'"
    : > "$T/proxy.log"
    rules ""
    setup "$d" --full --endpoint "$PEP" --connections 1 --chunk-mb 0.03125 2>"$T/r2.err"; rc=$?
    check "resume: the second run completes" [ $rc = 0 ]
    check "resume: byte-identical" same_as_source "$d"
    check "resume: completed parts were not fetched again" python3 "$HERE/verify.py" overlap "$T/proxy.log" "${held[@]}"
    # Ctrl-C: exit 130, resumable
    rules "slow safetensors -1 262144"
    setup_bg "$T/int" --full --endpoint "$PEP" --connections 1 --chunk-mb 0.03125 2>"$T/i1.err"
    pid=$!
    wait_journaled "$T/int" 60
    kill -INT $pid; wait $pid; rc=$?
    check "Ctrl-C: exit 130 and says how to resume" bash -c "[ $rc = 130 ] && grep -q 'run the same command again' '$T/i1.err'"
    rules ""
    setup "$T/int" --full --endpoint "$PEP" 2>/dev/null
    check "Ctrl-C: the next run completes byte-identical" same_as_source "$T/int"
}

# OWNER/NAME@REV: k3 setup installs a revision other than main into MODELS/OWNER/NAME@REV and
# records it; k3 run finds each install by the revision, by the commit it pinned (short
# form too), and refuses a revision no install holds (src/setup/setup.h, part 4)
group_byname() {
    local m=$T/models r=moonshotai/Kimi-K3 want got rc v
    # k3 run by name with no Hugging Face cache: only k3 setup's folders; stderr in $T/bn.err
    by_name() {
        HF_HUB_CACHE=$T/nohub K3_MODELS=$m "$K3" run "$1" --prompt-ids 1,2,3 --max-new 3 --ids \
            2>"$T/bn.err"
    }
    want=$("$K3" run "$FIX" --prompt-ids 1,2,3 --max-new 3 --ids 2>/dev/null)
    K3_MODELS=$m setup "$r@$COMMIT" --full --endpoint "$EP" 2>"$T/bn1.err"; rc=$?
    check "byname: setup NAME@COMMIT: exit 0" [ $rc = 0 ]
    check "byname: ... into MODELS/NAME@COMMIT" grep -q "installing into $m/$r@$COMMIT\$" "$T/bn1.err"
    check "byname: ... byte-identical" same_as_source "$m/$r@$COMMIT"
    K3_MODELS=$m setup "$r@main" --full --endpoint "$EP" 2>"$T/bn2.err"; rc=$?
    check "byname: setup NAME@main: exit 0, into MODELS/NAME" bash -c "[ $rc = 0 ] && grep -q 'installing into $m/$r\$' '$T/bn2.err'"
    got=$(by_name "$r@$COMMIT")
    check "byname: run NAME@COMMIT loads MODELS/NAME@COMMIT" bash -c "[ '$got' = '$want' ] && grep -q 'loaded $m/$r@$COMMIT:' '$T/bn.err'"
    for v in main "${COMMIT:0:7}"; do
        got=$(by_name "$r@$v")
        check "byname: run NAME@$v loads MODELS/NAME" bash -c "[ '$got' = '$want' ] && grep -q 'loaded $m/$r:' '$T/bn.err'"
    done
    by_name "$r@v2" >/dev/null; rc=$?
    check "byname: run NAME@v2 refused (exit 3)" [ $rc = 3 ]
    check "byname: ... naming what MODELS/NAME holds" grep -q "$m/$r holds revision main, commit $COMMIT" "$T/bn.err"
    check "byname: ... and the fix" grep -q "install it with k3 setup $r@v2" "$T/bn.err"
}

start_nginx
GROUPS_TO_RUN=${*:-full stream streamrun budget auto faults drip resume byname}
for g in $GROUPS_TO_RUN; do
    echo "== $g"
    "group_$g"
done
echo "$PASSES passed, $FAILS failed"
[ $FAILS = 0 ]
