#!/bin/sh
# bench-chat.sh [MODEL_DIR] [TURNS] [MAX_NEW] — what keeping a conversation's state saves in
# `k3 chat`: a scripted conversation of TURNS turns (greedy, MAX_NEW tokens per reply), then
# /save + /load and one more turn, which re-reads the whole conversation from scratch. Prints
# one row per turn: tokens prefilled, tokens kept from earlier turns, the whole conversation
# (what an engine without kept state prefills for the same ids) and the prefill time.
set -eu
K3=${K3_BIN:-./k3}
DIR=${1:-tests/fixtures/k3-nano}
TURNS=${2:-6}
MAX_NEW=${3:-48}
TMP=$(mktemp -d /tmp/k3-bench-chat-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

i=1
while [ "$i" -le "$TURNS" ]; do
    echo "Turn $i: tell me one more fact about the number $i, briefly."
    i=$((i + 1))
done > "$TMP/in"
printf '/save %s\n/load %s\nOne last question.\n' "$TMP/conv.json" "$TMP/conv.json" >> "$TMP/in"

"$K3" chat "$DIR" --max-new "$MAX_NEW" -q < "$TMP/in" > "$TMP/out"
echo "| turn | prefilled | kept | whole conversation | prefill s | prefill tok/s |"
echo "|---:|---:|---:|---:|---:|---:|"
sed -n 's/.*\[\([0-9]*\) new tokens prefilled (\([0-9]*\) kept from earlier turns) in \([0-9.]*\) s;.*/\1 \2 \3/p' \
    "$TMP/out" | awk -v turns="$TURNS" '{
        label = NR <= turns ? NR : "after /load"
        printf "| %s | %d | %d | %d | %.3f | %.0f |\n", label, $1, $2, $1 + $2, $3, $1 / ($3 + 1e-9)
        if (NR <= turns) { n += $1; w += $1 + $2; t += $3 } }
    END { printf "| turns 1-%d | %d | | %d | %.3f | |\n", turns, n, w, t }'
