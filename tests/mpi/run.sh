#!/bin/sh
# tests/mpi/run.sh — expert parallelism over MPI (issue 19), run by `make test-mpi`:
#  1. `mpirun -np 2` and `-np 3` on one host: logits (--dump-logits), routing (--router-trace)
#     and printed tokens byte-identical (cmp) to the single-process k3, on k3-nano and
#     k3-tiny-kjv, token by token (--chunk 1), in prefill chunks (--chunk 3 and the default),
#     with speculation (--spec 4: verification passes and rewinds), and sampled (seeded);
#  2. per-rank folders through the %r placeholder in --dirs (the shards only there), and a
#     rank whose folder lacks a shard: a non-zero exit within seconds naming rank and shard;
#  3. `k3 serve` under mpirun: one chat request's reply (curl) identical to one process's;
#     `--parallel 4 --spec 3` on 2 ranks: 4 requests at once in shared passes (>= 2 rows per
#     pass), each reply identical to it alone in one process;
#  4. faults: an expert rank 1 cannot read mid-run (serve: the request fails naming rank 1,
#     host, shard and expert); a rank killed with SIGKILL mid-run, and a rank stopped
#     (SIGSTOP, a hung host) with K3_MPI_TIMEOUT=2: each ends the job within seconds with a
#     message naming rank 2; and a rank lost after one peer heard from it and before another
#     did, which rank 0 must still name (not the peer left waiting on it).
# K3_BIN: the single-process k3 (reference); K3_MPI_BIN: k3 built with MPI=1; K3_MPI_TEST_BIN:
# its test build (-DK3_TEST_CONTROLS), for the lost-rank test only; the shipped K3_MPI_BIN must
# not know K3_TEST_MPI_STALL_LAYER (checked first). Prints
# "N passed, M failed" last; exits non-zero on a failure; SKIPPED when mpirun is missing.
set -u
K3_BIN=${K3_BIN:-./k3}
K3_MPI_BIN=${K3_MPI_BIN:-./build-mpi/k3}
# the test build (make MPI=1 build-mpi/k3-test: -DK3_TEST_CONTROLS) for the one test that
# reaches inside (K3_TEST_MPI_STALL_LAYER); the shipped k3 reads no test variable
K3_MPI_TEST_BIN=${K3_MPI_TEST_BIN:-./build-mpi/k3-test}
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIPPED test-mpi: mpirun is missing (apt-get install openmpi-bin libopenmpi-dev, or" \
         "scripts/install-deps.sh)"
    exit 0
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
K3_BIN=$(cd "$(dirname "$K3_BIN")" && pwd)/$(basename "$K3_BIN")
K3_MPI_BIN=$(cd "$(dirname "$K3_MPI_BIN")" && pwd)/$(basename "$K3_MPI_BIN")
K3_MPI_TEST_BIN=$(cd "$(dirname "$K3_MPI_TEST_BIN")" && pwd)/$(basename "$K3_MPI_TEST_BIN")
T=$(mktemp -d /tmp/k3-mpi.XXXXXX)
trap '[ -n "${K3_MPI_KEEP:-}" ] || rm -rf "$T"' EXIT
# one OpenMP thread per rank, passive waits: several ranks share this machine's cores
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
MPIRUN="mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x OMP_WAIT_POLICY${ASAN_OPTIONS:+ -x ASAN_OPTIONS}"
PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok      mpi/$1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL    mpi/$1: $2"; }

# The shipped binary holds no test control (the test build does)
if strings "$K3_MPI_BIN" | grep -q K3_TEST_MPI; then
    bad shipped_k3_has_no_test_control "$K3_MPI_BIN knows K3_TEST_MPI_STALL_LAYER"
elif ! strings "$K3_MPI_TEST_BIN" | grep -q K3_TEST_MPI_STALL_LAYER; then
    bad shipped_k3_has_no_test_control "$K3_MPI_TEST_BIN lacks K3_TEST_MPI_STALL_LAYER"
else
    ok shipped_k3_has_no_test_control
fi
NANO=$ROOT/tests/fixtures/k3-nano
KJV=$ROOT/tests/fixtures/k3-tiny-kjv
PROMPT="And God said, Let there be light: and there was light. And God saw the light"

# ---- 1. run: bit-identical to one process --------------------------------------------------
# same NAME MODEL NP FLAGS...: the single-process run, then NP ranks, compared byte for byte.
same() {
    name=$1 model=$2 np=$3
    shift 3
    (cd "$T" && "$K3_BIN" run "$model" --prompt "$PROMPT" --max-new 24 "$@" \
        --dump-logits ref.bin --router-trace ref.trace >ref.out 2>ref.err)
    rc1=$?
    (cd "$T" && $MPIRUN -np "$np" "$K3_MPI_BIN" run "$model" --prompt "$PROMPT" --max-new 24 \
        "$@" --dump-logits mpi.bin --router-trace mpi.trace >mpi.out 2>mpi.err)
    rc2=$?
    if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
        bad "$name" "exit $rc1 (one process) / $rc2 ($np ranks): $(tail -3 "$T/mpi.err")"
    elif [ ! -s "$T/ref.bin" ] || [ ! -s "$T/ref.trace" ] || [ ! -s "$T/ref.out" ]; then
        bad "$name" "the single-process run wrote no logits, trace or text"
    elif ! cmp -s "$T/ref.bin" "$T/mpi.bin"; then
        bad "$name" "logits differ: $(cmp "$T/ref.bin" "$T/mpi.bin" 2>&1 | head -1)"
    elif ! cmp -s "$T/ref.trace" "$T/mpi.trace"; then
        bad "$name" "routing differs: $(cmp "$T/ref.trace" "$T/mpi.trace" 2>&1 | head -1)"
    elif ! cmp -s "$T/ref.out" "$T/mpi.out"; then
        bad "$name" "tokens differ"
    elif ! grep -q "rank $((np - 1)) of $np on " "$T/mpi.err" ||
         ! grep -q "rank $((np - 1)) on .*communication" "$T/mpi.err"; then
        bad "$name" "no per-rank startup or summary line for rank $((np - 1))"
    else
        ok "$name"
    fi
}
for np in 2 3; do
    same "nano_np${np}_steps" "$NANO" $np --chunk 1
    same "nano_np${np}_chunks" "$NANO" $np --chunk 3
    same "kjv_np${np}_default_chunk" "$KJV" $np
    same "kjv_np${np}_sampled" "$KJV" $np --temperature 0.9 --seed 11 --chunk 5
done
# speculation: the drafter must have had drafts verified and some rejected (rewinds)
same kjv_np3_spec "$KJV" 3 --spec 4
if grep -q "speculation (up to 4 drafts): .*([1-9][0-9]* passes +" "$T/mpi.err"; then
    ok kjv_np3_spec_verified_passes
else
    bad kjv_np3_spec_verified_passes "no verification pass: $(grep speculation "$T/mpi.err")"
fi

# ---- 2. per-rank folders: %r in --dirs -----------------------------------------------------
# The model folder keeps config, index and tokenizer; the shards are only in r0/, r1/, r2/.
mkdir -p "$T/model" "$T/r0" "$T/r1" "$T/r2"
for f in "$KJV"/*; do
    case $f in
    *.safetensors) for r in 0 1 2; do ln -s "$f" "$T/r$r/"; done ;;
    *) ln -s "$f" "$T/model/" ;;
    esac
done
(cd "$T" && "$K3_BIN" run "$KJV" --prompt "$PROMPT" --max-new 12 --dump-logits ref.bin >ref.out 2>ref.err)
(cd "$T" && $MPIRUN -np 3 "$K3_MPI_BIN" run "$T/model" --dirs "$T/r%r" --prompt "$PROMPT" \
    --max-new 12 --dump-logits mpi.bin >mpi.out 2>mpi.err)
rc=$?
if [ $rc -eq 0 ] && cmp -s "$T/ref.bin" "$T/mpi.bin" && cmp -s "$T/ref.out" "$T/mpi.out" &&
   grep -q "folders: $T/r2" "$T/mpi.err"; then
    ok rank_folders_identical
else
    bad rank_folders_identical "exit $rc: $(tail -2 "$T/mpi.err")"
fi
SHARD=$(ls "$T/r1" | sort | sed -n 2p)
rm "$T/r1/$SHARD"
start=$(date +%s)
(cd "$T" && timeout 60 $MPIRUN -np 3 "$K3_MPI_BIN" run "$T/model" --dirs "$T/r%r" \
    --prompt "$PROMPT" --max-new 12 >miss.out 2>miss.err)
rc=$?
took=$(($(date +%s) - start))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 20 ] &&
   grep -q "rank 1 (host [^)]*) could not load the model: .*$SHARD" "$T/miss.err"; then
    ok rank_folder_missing_shard_fails_cleanly
else
    bad rank_folder_missing_shard_fails_cleanly "exit $rc after ${took}s: $(tail -3 "$T/miss.err")"
fi

# ---- 3. serve: one request, the same reply ---------------------------------------------------
# serve_reply OUT CMD...: starts the server (port 0), sends one greedy chat request, stops it.
serve_reply() {
    out=$1
    shift
    "$@" >"$T/serve.log" 2>"$T/serve.err" &
    spid=$!
    url="" # up to 30 s: a loaded 2-core machine starts two ranks slowly
    for i in $(seq 1 300); do
        url=$(sed -n 's/^k3 serve: listening on \(http[^ ]*\) .*/\1/p' "$T/serve.log")
        [ -n "$url" ] && break
        sleep 0.1
    done
    if [ -n "$url" ]; then
        curl -s -m 60 "$url/chat/completions" -H 'Content-Type: application/json' \
            -d '{"messages":[{"role":"user","content":"And God said"}],"temperature":0,
                 "max_tokens":24,"logprobs":true,"top_logprobs":3}' >"$out"
    fi
    # stop rank 0 (or the one process): it ends the server and tells the other ranks to quit
    r0=$spid
    for p in $(pgrep -P $spid); do
        cat "/proc/$p/environ" 2>/dev/null | tr '\0' '\n' | grep -q '^OMPI_COMM_WORLD_RANK=0$' && r0=$p
    done
    kill -TERM $r0 2>/dev/null
    for i in $(seq 1 100); do kill -0 $spid 2>/dev/null || break; sleep 0.1; done
    kill -KILL $spid 2>/dev/null
    wait $spid 2>/dev/null
}
# the reply without its id and timestamp
strip() { sed -e 's/"id":"[^"]*"//' -e 's/"created":[0-9]*//' "$1"; }
serve_reply "$T/one.json" "$K3_BIN" serve "$KJV" --port 0
serve_reply "$T/np3.json" $MPIRUN -np 3 "$K3_MPI_BIN" serve "$KJV" --port 0
if [ -s "$T/one.json" ] && grep -q '"content"' "$T/one.json" &&
   [ "$(strip "$T/one.json")" = "$(strip "$T/np3.json")" ]; then
    ok serve_np3_identical_reply
else
    bad serve_np3_identical_reply "one: $(head -c 300 "$T/one.json"); np3: $(head -c 300 "$T/np3.json"); $(tail -2 "$T/serve.err")"
fi

# One pass under MPI (issue 27): `serve --parallel 4 --spec 3` on 2 ranks, 4 requests at once
# (greedy with speculation, seeded sampling, an echo + logprobs completion, a greedy chat):
# rank 0 sends each round's pass (decode rows, verification rows, prefill and echo chunks) to
# rank 1, which replays it. >= 2 token rows per pass (/metrics k3_pass_rows) and every reply
# identical to the same request sent alone to one process (the seeded one too: with --spec each
# id is drawn at its own row as without it, whatever was drafted).
CODE='for (i = 0; i < n; i++) { a[i] = b[i]; } for (i = 0; i < n; i++) { a[i] = b[i]; }'
REQ1='{"prompt":"'"$CODE"'","max_tokens":48,"temperature":0}'
REQ2='{"prompt":"'"$CODE"' while","max_tokens":48,"temperature":0.8,"seed":5}'
REQ3='{"prompt":"int main(void) { return 0; } int main","max_tokens":24,"temperature":0,"echo":true,"logprobs":2}'
REQ4='{"messages":[{"role":"user","content":"'"$CODE"'"}],"max_tokens":48,"temperature":0}'
# serve_four DIR TOGETHER(1|0) CMD...: a server; with TOGETHER the 4 requests at once (and
# DIR/rows: rows and passes they ran), then each alone (DIR/aN.json).
serve_four() {
    dir=$1 together=$2
    shift 2
    mkdir -p "$dir"
    "$@" >"$T/serve.log" 2>"$T/serve.err" &
    spid=$!
    url="" # up to 30 s: a loaded 2-core machine starts two ranks slowly
    for i in $(seq 1 300); do
        url=$(sed -n 's/^k3 serve: listening on \(http[^ ]*\) .*/\1/p' "$T/serve.log")
        [ -n "$url" ] && break
        sleep 0.1
    done
    rows() { curl -s -m 10 "${url%/v1}/metrics" | awk '/^k3_pass_rows_sum/ {s=$2} /^k3_pass_rows_count/ {c=$2} END {print s, c}'; }
    send() { # send N OUT
        eval "body=\$REQ$1"
        path=completions
        [ "$1" = 4 ] && path=chat/completions
        curl -s -m 120 "$url/$path" -H 'Content-Type: application/json' -d "$body" >"$2"
    }
    if [ -n "$url" ] && [ "$together" = 1 ]; then
        before=$(rows)
        send 1 "$dir/t1.json" & p1=$!
        send 2 "$dir/t2.json" & p2=$!
        send 3 "$dir/t3.json" & p3=$!
        send 4 "$dir/t4.json" & p4=$!
        wait $p1 $p2 $p3 $p4
        echo "$before $(rows)" >"$dir/rows"
    fi
    for n in 1 2 3 4; do [ -n "$url" ] && send $n "$dir/a$n.json"; done
    r0=$spid
    for p in $(pgrep -P $spid); do
        cat "/proc/$p/environ" 2>/dev/null | tr '\0' '\n' | grep -q '^OMPI_COMM_WORLD_RANK=0$' && r0=$p
    done
    kill -TERM $r0 2>/dev/null
    for i in $(seq 1 100); do kill -0 $spid 2>/dev/null || break; sleep 0.1; done
    kill -KILL $spid 2>/dev/null
    wait $spid 2>/dev/null
}
serve_four "$T/one4" 0 "$K3_BIN" serve "$KJV" --port 0 --parallel 4 --spec 3 --no-reuse
serve_four "$T/np2x4" 1 $MPIRUN -np 2 "$K3_MPI_BIN" serve "$KJV" --port 0 --parallel 4 --spec 3 \
    --state-cache 4 --no-reuse
why=""
for n in 1 2 3 4; do
    if ! grep -q '"choices"' "$T/one4/a$n.json"; then why="$why; request $n alone failed: $(head -c 200 "$T/one4/a$n.json")"
    elif [ "$(strip "$T/one4/a$n.json")" != "$(strip "$T/np2x4/t$n.json")" ]; then
        why="$why; request $n at once on 2 ranks differs from it alone in one process: $(head -c 200 "$T/np2x4/t$n.json")"
    elif [ "$(strip "$T/one4/a$n.json")" != "$(strip "$T/np2x4/a$n.json")" ]; then
        why="$why; request $n alone on 2 ranks differs"
    fi
done
set -- $(cat "$T/np2x4/rows" 2>/dev/null) 0 0 0 0
per=$(awk -v a="$1" -v b="$2" -v c="$3" -v d="$4" 'BEGIN { if (d > b) printf "%.2f", (c - a) / (d - b); else print 0 }')
if [ -z "$why" ] && awk -v p="$per" 'BEGIN { exit !(p >= 2) }'; then
    ok "serve_np2_parallel_spec_one_pass ($per rows per pass)"
else
    bad serve_np2_parallel_spec_one_pass "$per rows per pass$why; $(tail -2 "$T/serve.err")"
fi

# An expert that rank 1 cannot read mid-run: its copy of shard 2 loses its experts (they lie
# after the spine tensors) once the server is up; the request fails naming rank 1, its host
# and the expert, and every rank stays in step (a second request gets the same answer).
SHARD2=$(ls "$T/r0" | sort | sed -n 2p)
SPINE_END=$(python3 - "$KJV/$SHARD2" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
h.pop('__metadata__', None)
print(8 + n + min(v['data_offsets'][0] for k, v in h.items() if '.experts.' in k))
PY
)
ln -sf "$KJV/$SHARD" "$T/r1/$SHARD" # back from the missing-shard case
rm -f "$T/r1/$SHARD2"
cp "$KJV/$SHARD2" "$T/r1/$SHARD2"
$MPIRUN -np 3 "$K3_MPI_BIN" serve "$T/model" --dirs "$T/r%r" --port 0 >"$T/serve.log" 2>"$T/serve.err" &
spid=$!
url="" # up to 30 s, as above: three ranks start slowly on a loaded 2-core machine
for i in $(seq 1 300); do
    url=$(sed -n 's/^k3 serve: listening on \(http[^ ]*\) .*/\1/p' "$T/serve.log")
    [ -n "$url" ] && break
    sleep 0.1
done
truncate -s "$SPINE_END" "$T/r1/$SHARD2"
for n in 1 2; do
    [ -n "$url" ] && curl -s -m 30 "$url/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"And God said","temperature":0,"max_tokens":8}' >"$T/expert$n.json"
done
for p in $(pgrep -P $spid); do
    cat "/proc/$p/environ" 2>/dev/null | tr '\0' '\n' | grep -q '^OMPI_COMM_WORLD_RANK=0$' && kill -TERM $p
done
for i in $(seq 1 100); do kill -0 $spid 2>/dev/null || break; sleep 0.1; done
kill -KILL $spid 2>/dev/null
wait $spid 2>/dev/null
if [ -n "$SPINE_END" ] && grep -q "rank 1 (host [^)]*) failed at MoE layer 1: .*expert" "$T/expert1.json" &&
   grep -q "rank 1 (host [^)]*) failed at MoE layer 1" "$T/expert2.json"; then
    ok rank_expert_read_fails_the_request_naming_rank
else
    bad rank_expert_read_fails_the_request_naming_rank "$(head -c 400 "$T/expert1.json" 2>/dev/null); $(tail -3 "$T/serve.err")"
fi

# ---- 4. faults ---------------------------------------------------------------------------------
# fault NAME SIGNAL: 3 ranks generating for long; SIGNAL to rank 2 once they generate; the job
# must end within 15 s, non-zero, naming rank 2.
fault() {
    name=$1 sig=$2
    rm -f "$T/fault.out"
    (cd "$T" && K3_MPI_TIMEOUT=2 timeout 60 $MPIRUN -x K3_MPI_TIMEOUT -np 3 "$K3_MPI_BIN" run -q \
        "$NANO" --prompt "$PROMPT" --max-new 4000 >fault.out 2>fault.err) &
    job=$!
    victim=""
    for i in $(seq 1 100); do # rank 2 of this job, once it runs
        for p in $(pgrep -x k3); do
            if cat "/proc/$p/environ" 2>/dev/null | tr '\0' '\n' | grep -q '^OMPI_COMM_WORLD_RANK=2$' &&
               cat "/proc/$p/environ" 2>/dev/null | tr '\0' '\n' | grep -q "^K3_MPI_TIMEOUT=2$"; then
                victim=$p
            fi
        done
        [ -n "$victim" ] && break
        sleep 0.1
    done
    # into the generation: rank 0 has written its first token (it flushes each one; its reply
    # runs ~2,950 more). A fixed pause could end while the ranks still start on a loaded machine.
    for i in $(seq 1 300); do
        [ -s "$T/fault.out" ] && break
        sleep 0.1
    done
    start=$(date +%s)
    [ -n "$victim" ] && kill "-$sig" "$victim"
    wait $job
    rc=$?
    took=$(($(date +%s) - start))
    [ -n "$victim" ] && kill -KILL "$victim" 2>/dev/null
    if [ -z "$victim" ]; then
        bad "$name" "rank 2 was not found running: $(tail -3 "$T/fault.err")"
    elif [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 15 ] && grep -q "rank 2" "$T/fault.err"; then
        ok "$name"
    else
        bad "$name" "exit $rc after ${took}s: $(tail -4 "$T/fault.err")"
    fi
}
fault killed_rank_ends_the_job KILL
fault hung_rank_times_out STOP
if grep -q "rank 2 (host [^)]*) \(sent\|took\) nothing .*MoE layer" "$T/fault.err"; then
    ok hung_rank_named_by_the_deadline
else
    bad hung_rank_named_by_the_deadline "$(tail -4 "$T/fault.err")"
fi

# A rank lost after rank 0 heard from it and before rank 1 did (K3_TEST_MPI_STALL_LAYER: the
# last rank sends layer 2 to rank 0 alone, then stops itself): rank 0, a layer ahead, misses
# ranks 1 and 2, and must name rank 2 (rank 1 reported that it waits on it), not rank 1.
start=$(date +%s)
(cd "$T" && K3_TEST_MPI_STALL_LAYER=2 K3_MPI_TIMEOUT=2 timeout 60 $MPIRUN -x K3_MPI_TIMEOUT \
    -x K3_TEST_MPI_STALL_LAYER -np 3 "$K3_MPI_TEST_BIN" run -q "$NANO" --prompt "$PROMPT" \
    --max-new 40 >stall.out 2>stall.err)
rc=$?
took=$(($(date +%s) - start))
for p in $(pgrep -x k3); do # a stopped rank mpirun left behind
    cat "/proc/$p/environ" 2>/dev/null | tr '\0' '\n' | grep -q '^K3_TEST_MPI_STALL_LAYER=' &&
        kill -KILL "$p"
done
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 15 ] &&
   grep -q "rank 0 of 3 ([^)]*): rank 2 (host [^)]*) sent nothing .*: rank 1 (host [^)]*) waits on it" \
       "$T/stall.err"; then
    ok rank_lost_between_peers_named_by_rank_0
else
    bad rank_lost_between_peers_named_by_rank_0 "exit $rc after ${took}s: $(grep '^k3' "$T/stall.err" | head -3)"
fi

echo "$PASS passed, $FAIL failed"
[ $FAIL -eq 0 ]
