#!/bin/sh
# load.sh — bounded load test of `k3 serve` on loopback (make bench-server).
#
# Starts `k3 serve` (the fixture model unless MODEL_DIR is given; --queue QUEUE, default 0) on a
# free loopback port, then runs ROUNDS rounds; in each, for SECONDS_PER_ROUND seconds at once:
#   - wrk -c MODELS_CONNS against GET /v1/models, and
#   - wrk -c CHAT_CONNS posting small chat requests (max_tokens 4; every other one streamed).
# After each round it records the server's RSS. It fails (exit 1) when the server died, when
# any request got no HTTP answer (wrk socket errors) or an answer other than 200 / 429, when a
# /v1/models request failed, or when RSS grew by more than RSS_SLACK_KB between the first and
# the last round (the first round is the warm-up: page cache, thread stacks, allocator pools).
#
# Needs wrk (Debian package wrk). Only 127.0.0.1 is ever contacted; every loop is bounded.
set -eu
cd "$(dirname "$0")/../.."
K3_BIN=${K3_BIN:-./k3}
MODEL_DIR=${MODEL_DIR:-tests/fixtures/k3-nano}
SECONDS_PER_ROUND=${SECONDS_PER_ROUND:-10}
ROUNDS=${ROUNDS:-3}
MODELS_CONNS=${MODELS_CONNS:-4}
CHAT_CONNS=${CHAT_CONNS:-8}
RSS_SLACK_KB=${RSS_SLACK_KB:-1024}
QUEUE=${QUEUE:-0}

command -v wrk >/dev/null || { echo "load.sh: wrk is not installed (apt-get install wrk)"; exit 1; }
TMP=$(mktemp -d)
PID=
cleanup() {
    [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

"$K3_BIN" serve "$MODEL_DIR" --port 0 --queue "$QUEUE" -q >"$TMP/out" 2>"$TMP/err" &
PID=$!
for _ in $(seq 100); do grep -q 'listening on' "$TMP/out" 2>/dev/null && break; sleep 0.1; done
URL=$(sed -n 's/.*listening on \([^ ]*\)\/v1 .*/\1/p' "$TMP/out")
[ -n "$URL" ] || { cat "$TMP/out" "$TMP/err"; exit 1; }
case "$URL" in http://127.0.0.1:*) ;; *) echo "load.sh: not loopback: $URL"; exit 1;; esac

cat >"$TMP/chat.lua" <<'EOF'
-- Small chat requests, alternately plain and streamed; counts statuses per thread.
local threads = {}
local plain = '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4}'
local stream = '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"stream":true}'
function setup(thread) table.insert(threads, thread) end
function init(args) n = 0; ok = 0; busy = 0; other = 0 end
function request()
  n = n + 1
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"] = "application/json"},
                    n % 2 == 0 and stream or plain)
end
function response(status, headers, body)
  if status == 200 then ok = ok + 1 elseif status == 429 then busy = busy + 1 else other = other + 1 end
end
function done(summary, latency, requests)
  local a, b, c = 0, 0, 0
  for _, t in ipairs(threads) do a = a + t:get("ok"); b = b + t:get("busy"); c = c + t:get("other") end
  local e = summary.errors
  io.write(string.format("RESULT requests=%d ok=%d busy=%d other=%d sockerr=%d p50_ms=%.2f p99_ms=%.2f\n",
    summary.requests, a, b, c, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
EOF
cat >"$TMP/models.lua" <<'EOF'
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d bad=%d sockerr=%d p50_ms=%.2f p99_ms=%.2f\n",
    summary.requests, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
EOF

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$PID/status"; }
field() { sed -n "s/.*RESULT.* $1=\([0-9.]*\).*/\1/p" "$2"; }

echo "k3 serve load test: $URL, model $MODEL_DIR, --queue $QUEUE, $ROUNDS rounds x" \
     "${SECONDS_PER_ROUND}s; /v1/models x $MODELS_CONNS conns + chat x $CHAT_CONNS conns at once"
echo "RSS at start: $(rss_kb) kB"
printf '| round | /v1/models req/s | p99 ms | chat req | 200 | 429 | lost | chat p50 ms | RSS kB |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
fail=0
first_rss=
for r in $(seq "$ROUNDS"); do
    wrk -t1 -c"$MODELS_CONNS" -d"${SECONDS_PER_ROUND}s" -s "$TMP/models.lua" "$URL/v1/models" >"$TMP/m$r" 2>&1 &
    WM=$!
    wrk -t2 -c"$CHAT_CONNS" -d"${SECONDS_PER_ROUND}s" --timeout 10s -s "$TMP/chat.lua" "$URL/v1/chat/completions" >"$TMP/c$r" 2>&1 || fail=1
    wait "$WM" || fail=1
    kill -0 "$PID" 2>/dev/null || { echo "the server died"; cat "$TMP/err"; exit 1; }
    rss=$(rss_kb)
    [ -n "$first_rss" ] || first_rss=$rss
    mreq=$(field requests "$TMP/m$r"); mbad=$(field bad "$TMP/m$r"); merr=$(field sockerr "$TMP/m$r")
    creq=$(field requests "$TMP/c$r"); ok=$(field ok "$TMP/c$r"); busy=$(field busy "$TMP/c$r")
    other=$(field other "$TMP/c$r"); cerr=$(field sockerr "$TMP/c$r")
    lost=$((creq - ok - busy + cerr))  # other statuses, unanswered or broken requests
    printf '| %d | %d | %s | %d | %d | %d | %d | %s | %d |\n' "$r" $((mreq / SECONDS_PER_ROUND)) \
        "$(field p99_ms "$TMP/m$r")" "$creq" "$ok" "$busy" "$lost" "$(field p50_ms "$TMP/c$r")" "$rss"
    [ "$mbad" = 0 ] && [ "$merr" = 0 ] || { echo "round $r: /v1/models failures: $mbad bad, $merr socket errors"; fail=1; }
    [ "$lost" = 0 ] || { echo "round $r: $lost chat requests without a 200/429 answer"; cat "$TMP/c$r"; fail=1; }
    [ "$ok" -gt 0 ] || { echo "round $r: no chat request succeeded"; fail=1; }
done
growth=$((rss - first_rss))
echo "RSS growth from round 1 to round $ROUNDS: $growth kB (allowed $RSS_SLACK_KB kB)"
[ "$growth" -le "$RSS_SLACK_KB" ] || fail=1
[ "$fail" = 0 ] && echo "load test: PASS" || echo "load test: FAIL"
exit "$fail"
