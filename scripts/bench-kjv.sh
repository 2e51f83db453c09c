#!/bin/sh
# Measurements on the trained k3-tiny-kjv (BENCHMARKS.md, "k3-tiny-kjv"):
#   scripts/bench-kjv.sh quality [TEXT]  k3 quality (int8 spine and --approx vs the exact path)
#                                        in windows of 128 predictions: [BOS] + 128 tokens, or
#                                        with BOS=0 129 tokens (the first one context only);
#                                        TEXT defaults to the whole held-out split
#                                        (Philippians-Revelation) when Debian's `bible`
#                                        (bible-kjv) is installed, else
#                                        tests/fixtures/kjv-heldout-philippians.txt
#   scripts/bench-kjv.sh spec            k3 bench spec, then k3 run --spec 4 on held-out prompts
#                                        (greedy and sampled), with the pays-off rule as shipped
#                                        (acceptance on every pass, rule off:
#                                        K3_TEST_VERBOSE=1 build/k3_tests kjv)
#   scripts/bench-kjv.sh cache           router traces of generations (k3 run --router-trace),
#                                        next-token expert overlap, k3 replay (hit rate by cache
#                                        size vs Belady), and a synthetic trace of the same shape
# Environment: K3 (default ./k3), MODEL (default tests/fixtures/k3-tiny-kjv), OUT (scratch
# folder, default a new one under /tmp). bench, replay and trace-gen are taken from ./k3-lab
# (or $K3_LAB) when that binary has them, else from $K3.
set -eu
K3=${K3:-./k3}
MODEL=${MODEL:-tests/fixtures/k3-tiny-kjv}
OUT=${OUT:-$(mktemp -d /tmp/bench-kjv.XXXXXX)}
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
mkdir -p "$OUT"

# The binary that runs `SUBCOMMAND --help` (k3-lab first: bench/replay may live there).
lab() {
    for b in ${K3_LAB:-./k3-lab} "$K3"; do
        if [ -x "$b" ] && "$b" "$@" --help >/dev/null 2>&1; then echo "$b"; return; fi
    done
    echo "bench-kjv: neither ./k3-lab nor $K3 has '$*'" >&2
    exit 2
}

heldout() {
    if [ $# -gt 0 ]; then cat "$1"
    elif command -v bible >/dev/null 2>&1; then
        bible -f "Philippians 1:1-Revelation 22:21" | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //'
    else cat tests/fixtures/kjv-heldout-philippians.txt
    fi
}

quality() {
    heldout "$@" >"$OUT/text.txt"
    mkdir -p "$OUT/pack"
    [ -f "$OUT/pack/k3-spine-int8.k3pack" ] || "$K3" pack "$MODEL" --out "$OUT/pack" -q --no-quality
    # BOS=0: windows of 129 text tokens, the first one context only (128 predictions each)
    bos=$("$K3" tokenize "$MODEL" --special '[BOS]')
    [ "${BOS:-1}" = 1 ] || bos=""
    "$K3" tokenize "$MODEL" --file "$OUT/text.txt" | tr ',' '\n' |
        awk -v bos="$bos" -v len=$((128 + (${BOS:-1} != 1))) '
            { w = w (w == "" && bos == "" ? "" : ",") $1; if (++n == len) { print bos w; w = ""; n = 0 } }
            END { if (n > 1) print bos w }' >"$OUT/windows.txt"
    echo "bench-kjv: $(wc -l <"$OUT/windows.txt") windows of 128 predictions" \
         "(BOS=${BOS:-1}; $(wc -w <"$OUT/text.txt") words) from $MODEL" >&2
    i=0
    while read -r w; do
        i=$((i + 1))
        "$K3" quality "$MODEL" --pack-dir "$OUT/pack" --modes int8,approx --ids "$w" \
            --max-tokens 129 --threads 1 -q --json "$OUT/q$i.json" >/dev/null
    done <"$OUT/windows.txt"
    # Prediction-weighted means over the windows; max |dlogit| is the max over all of them.
    cat "$OUT"/q*.json | awk '
        /"predictions"/ { gsub(/[^0-9]/, ""); p = $0 }
        /"mode"/ {
            line = $0; m = line; sub(/.*"mode": "/, "", m); sub(/".*/, "", m)
            if (!(m in n)) order[++k] = m
            n[m] += p
            split("nll mean_kl top1_agreement max_abs_dlogit", keys, " ")
            for (j = 1; j <= 4; j++) {
                v = line
                if (!sub(".*\"" keys[j] "\": ", "", v)) continue
                sub(/[,}].*/, "", v)
                if (j == 4) { if (v + 0 > mx[m]) mx[m] = v + 0 }
                else s[m, j] += v * p
            }
        }
        END {
            printf "| mode | predictions | NLL/token | perplexity | mean KL | top-1 | max \\|Δlogit\\| |\n"
            printf "|---|---:|---:|---:|---:|---:|---:|\n"
            for (i = 1; i <= k; i++) {
                m = order[i]; nll = s[m, 1] / n[m]
                if (m == "exact")
                    printf "| %s | %d | %.4f | %.3f | (ref) | | |\n", m, n[m], nll, exp(nll)
                else
                    printf "| %s | %d | %.4f | %.3f | %.3g | %.2f%% | %.3g |\n", m, n[m], nll,
                           exp(nll), s[m, 2] / n[m], 100 * s[m, 3] / n[m], mx[m]
            }
        }'
}

# Held-out verse openings (not in the training split).
PROMPTS="For to me to live is Christ|And I saw a new heaven and a new earth|Grace be unto you, and peace|Now faith is the substance of things hoped for"

spec() {
    "$(lab bench spec)" bench spec "$MODEL" --spec 4 --max-new 64
    echo
    echo "| prompt | sampling | tokens | drafts proposed | accepted | accepted per pass | passes per token | output |"
    echo "|---|---|---:|---:|---:|---:|---:|---|"
    echo "$PROMPTS" | tr '|' '\n' | while read -r p; do
        for mode in greedy "--temperature 0.8 --seed 7"; do
            samp=$mode; [ "$mode" = greedy ] && samp=""
            # shellcheck disable=SC2086
            "$K3" run "$MODEL" --prompt "$p" --max-new 128 --ids $samp >"$OUT/plain.ids" 2>/dev/null
            # shellcheck disable=SC2086
            "$K3" run "$MODEL" --prompt "$p" --max-new 128 --ids --spec 4 $samp \
                >"$OUT/spec.ids" 2>"$OUT/spec.err"
            same=differs; cmp -s "$OUT/plain.ids" "$OUT/spec.ids" && same=identical
            [ -n "$samp" ] && same="$same (sampled: may differ)"
            awk -v p="$p" -v m="$mode" -v same="$same" '/speculation/ {
                for (i = 1; i <= NF; i++) {
                    if ($(i + 1) == "drafts" && $(i + 2) == "proposed,") d = $i
                    if ($(i + 1) == "accepted") a = $i
                    if ($(i + 1) == "passes" && $(i + 2) == "+") ps = substr($i, 2)
                    if ($(i + 1) == "forward") ppt = $i
                    if ($(i + 1) ~ /^tokens\)/) t = $i
                }
                printf "| %s | %s | %s | %s | %s | %.2f | %s | %s |\n", p, m, t, d, a,
                       ps ? a / ps : 0, ppt, same
            }' "$OUT/spec.err"
        done
    done
}

# Share of each (step, layer)'s experts also chosen at the previous step in that layer.
overlap() {
    awk '{
        s = $0; sub(/.*"layer":/, "", s); sub(/,.*/, "", s); l = s
        ids = $0; sub(/.*"ids":\[/, "", ids); sub(/\].*/, "", ids)
        k = split(ids, e, ",")
        if (l in prev) {
            for (i = 1; i <= k; i++) if (index("," prev[l] ",", "," e[i] ",")) hit++
            tot += k
        }
        prev[l] = ids
    } END { printf "%.1f%% (%d of %d selections)\n", 100 * hit / tot, hit, tot }' "$1"
}

cache() {
    slots=3,4,6,8,12,16,24,40
    n=0
    echo "$PROMPTS" | tr '|' '\n' | while read -r p; do
        n=$((n + 1))
        "$K3" run "$MODEL" --prompt "$p" --max-new 1024 --temperature 0.8 --seed "$n" -q \
            --router-trace "$OUT/tr$n.jsonl" >/dev/null
        # steps renumbered so that the four generations follow one another in one trace
        awk -v base=$(( (n - 1) * 100000 )) '{ s = $0; sub(/.*"step":/, "", s); sub(/,.*/, "", s)
            sub(/"step":[0-9]+/, "\"step\":" (base + s)); print }' "$OUT/tr$n.jsonl" \
            >>"$OUT/trace.jsonl"
    done
    echo "next-token expert overlap (sampled generations): $(overlap "$OUT/trace.jsonl")"
    "$(lab replay)" replay "$OUT/trace.jsonl" --slots $slots
    "$K3" run "$MODEL" --prompt "In the beginning" --max-new 1024 -q \
        --router-trace "$OUT/greedy.jsonl" >/dev/null
    echo "next-token expert overlap (greedy, 'In the beginning'): $(overlap "$OUT/greedy.jsonl")"
    "$(lab replay)" replay "$OUT/greedy.jsonl" --slots $slots
    steps=$(($(wc -l <"$OUT/trace.jsonl") / 5))
    "$(lab trace-gen)" trace-gen "$OUT/synth.jsonl" --tokens "$steps" --layers 5 --experts 16 \
        --top-k 2 --hot 2 --hot-mass 0.2
    echo "next-token expert overlap (synthetic): $(overlap "$OUT/synth.jsonl")"
    "$(lab replay)" replay "$OUT/synth.jsonl" --slots $slots
}

case "${1:-}" in
quality) shift; quality "$@" ;;
spec) spec ;;
cache) cache ;;
*) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
