#!/bin/sh
# bench-int8.sh MODEL_DIR PACK_DIR [TOKENS] — decode time per token with the exact BF16 spine,
# the packed int8 spine and int8 with --approx (build the pack first: k3 pack MODEL_DIR --out
# PACK_DIR), beside the rate at which this machine reads the pack from the page cache (the
# memory-side limit),
# measured in the same run. Prints a markdown table for BENCHMARKS.md. Model and pack should
# fit in RAM (the runs are warm); K3_BIN picks the binary (default ./k3).
set -eu
MODEL=${1:?usage: bench-int8.sh MODEL_DIR PACK_DIR [TOKENS]}
PACK=${2:?usage: bench-int8.sh MODEL_DIR PACK_DIR [TOKENS]}
N=${3:-8}
REPEAT=${REPEAT:-3}
K3=${K3_BIN:-./k3}
PACKFILE="$PACK/k3-spine-int8.k3pack"

# GB/s of a second read of FILE (the first one puts it in the page cache).
read_rate() {
    cat "$1" >/dev/null
    dd if="$1" of=/dev/null bs=16M 2>&1 | awk '/copied/ {
        for (i = 1; i <= NF; i++) if ($i == "bytes") b = $(i - 1); else if ($i ~ /^s,?$/) s = $(i - 1)
        printf "%.2f", b / s / 1e9 }'
}

# Wall seconds of `k3 run` producing N tokens with the given extra flags.
run_s() {
    n=$1
    shift
    t0=$(date +%s.%N)
    "$K3" run "$MODEL" --prompt-ids 1 --max-new "$n" --ids -q "$@" >/dev/null
    t1=$(date +%s.%N)
    echo "$t1 $t0" | awk '{ print $1 - $2 }'
}

# Seconds per decoded token: (time for N tokens - time for 1) / (N - 1), so load and the first
# token cancel out; the best of REPEAT tries (other processes only ever add time).
decode() {
    best=""
    for _ in $(seq "$REPEAT"); do
        a=$(run_s 1 "$@")
        b=$(run_s "$N" "$@")
        best=$(echo "$a $b $best" | awk -v n="$N" '{ t = ($2 - $1) / (n - 1)
            if (NF == 3 && $3 < t) t = $3; printf "%.3f", t }')
    done
    echo "$best"
}

pack_gb=$(stat -c %s "$PACKFILE" | awk '{ printf "%.3f", $1 / 1e9 }')
rate=$(read_rate "$PACKFILE")
s_bf16=$(decode --spine bf16)
s_int8=$(decode --spine int8 --pack-dir "$PACK")
s_apx=$(decode --spine int8 --pack-dir "$PACK" --approx)
echo "| spine | decode s/token | speed-up | int8 pack | page-cache read of the pack |"
echo "|---|---|---|---|---|"
echo "| bf16 (exact) | $s_bf16 | 1.00 | | |"
echo "| int8 | $s_int8 | $(echo "$s_bf16 $s_int8" | awk '{ printf "%.2f", $1 / $2 }') |" \
     "$pack_gb GB | $rate GB/s |"
echo "| int8 --approx | $s_apx | $(echo "$s_bf16 $s_apx" | awk '{ printf "%.2f", $1 / $2 }') |" \
     "$pack_gb GB | $rate GB/s |"
echo "($N tokens per mode, best of $REPEAT, model $(basename "$MODEL"), load average" \
     "$(cut -d' ' -f1-3 /proc/loadavg))"
