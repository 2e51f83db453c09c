#!/bin/bash
# gpu-check.sh — the GPU backend's whole check in one go (issue 9), for a machine with an NVIDIA
# GPU: the GPU tests (every CUDA kernel against the CPU scalar kernel, the k3-nano fixtures on
# the GPU, greedy tokens against the CPU path, streamed spine + small expert cache, state
# files), the k3-wide fixtures on the GPU when its generator is at hand, then `k3-lab bench-gpu`
# on a synthetic K3-shaped checkpoint; prints a summary table last. Logs go to $OUT (or
# ./gpu-check-out).
#
#   scripts/gpu-check.sh prepare   # on a build machine with the Debian deps and nvcc: builds
#                                  # with make CUDA=1 and stages the binaries, their shared
#                                  # libraries and ../shared's k3-wide generator and references
#                                  # in .gpu/ (git-ignored), for a GPU machine without them
#   scripts/gpu-check.sh run       # on the GPU machine: uses .gpu/ when present, else builds
#
# Environment: K3_SHARED (default ../shared), K3_SCRATCH (default /dev/shm when it has 20 GB
# free, else /tmp), SKIP_WIDE=1, SKIP_BENCH=1, SKIP_STREAM=1 (the streamed-spine decode run,
# last), KERNELS_ONLY=1 (the benchmark measures the kernels alone: no synthetic checkpoint, no
# decode, no greedy comparison), K3_MX_SWEEP=1 (the benchmark also times every MXFP4 launch
# schedule, kern.h), K3_DEADLINE (seconds for the whole run, default 560), K3_PREBUILT=1
# (prepare: stage build-cuda as is), TEST_TIMEOUT (seconds for stage 1, default 240).
#
# Exit status (run): 0 when every GPU test ran and passed and the CPU and GPU greedy tokens
# agree (when compared), 1 otherwise, 12 when no CUDA device answers (checked first, with
# k3's own message: driver missing, no GPU visible, or a k3 built without CUDA).
set -u -o pipefail
cd "$(dirname "$0")/.."

prepare() {
    [ "${K3_PREBUILT:-0}" = 1 ] || make -j"$(nproc)" CUDA=1 build-cuda/k3 build-cuda/k3-lab \
        build-cuda/k3_tests || exit 1
    rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
    cp build-cuda/k3 build-cuda/k3-lab build-cuda/k3_tests .gpu/bin/
    # every shared library but glibc's own, so the binaries run where the -dev packages are not
    ldd build-cuda/k3 build-cuda/k3-lab build-cuda/k3_tests | awk '/=> \// {print $3}' | sort -u |
        grep -vE '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux-x86-64)\.so' |
        while read -r lib; do cp -L "$lib" .gpu/lib/; done
    local shared=${K3_SHARED:-../shared}
    if [ -f "$shared/tools/make_k3_wide.py" ]; then
        mkdir -p .gpu/shared/tools .gpu/shared/fixtures
        cp "$shared/tools/make_k3_wide.py" .gpu/shared/tools/
        cp -r "$shared/fixtures/k3-wide" "$shared/fixtures/tokenizer" .gpu/shared/fixtures/
    fi
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    du -sh .gpu
}

run() {
    OUT=${OUT:-$PWD/gpu-check-out}
    mkdir -p "$OUT"
    local K3 LAB T SHARED
    if [ -x .gpu/bin/k3 ]; then
        K3=.gpu/bin/k3 LAB=.gpu/bin/k3-lab T=.gpu/bin/k3_tests SHARED=.gpu/shared
        export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    else
        make -j"$(nproc)" CUDA=1 build-cuda/k3 build-cuda/k3-lab build-cuda/k3_tests 2>&1 | tail -5
        K3=build-cuda/k3 LAB=build-cuda/k3-lab T=build-cuda/k3_tests SHARED=${K3_SHARED:-../shared}
    fi
    if [ "$K3" = .gpu/bin/k3 ] && [ build-cuda/k3 -nt .gpu/bin/k3 ]; then
        echo "note: .gpu/bin/k3 (staged by prepare) is older than build-cuda/k3; it is the one" \
            "tested: run $0 prepare again to test the newer build"
    fi
    # a device must answer before anything else: without one every stage would skip or fail
    "$K3" run --device cuda --prompt-ids 1792 --max-new 1 -q > /dev/null 2> "$OUT/device.err"
    local st=$?
    if [ "$st" != 0 ]; then
        cat "$OUT/device.err" >&2
        echo "gpu-check: no usable CUDA device for $K3 (exit $st): this check needs an NVIDIA" \
            "GPU that nvidia-smi lists, and a k3 built with make CUDA=1" >&2
        exit 12
    fi
    local SCR=${K3_SCRATCH:-}
    if [ -z "$SCR" ]; then
        SCR=/tmp
        [ "$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')" -gt 20000000 ] 2>/dev/null && SCR=/dev/shm
    fi
    SCR=$SCR/k3-gpu-check
    mkdir -p "$SCR"
    {
        date -u '+date: %Y-%m-%d %H:%M UTC'
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
            --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
        command -v nvcc >/dev/null && nvcc --version | tail -1 | sed 's/^/nvcc: /'
        echo "cpu: $(nproc) cores; scratch: $SCR"
    } | tee "$OUT/machine.txt"

    # stages run in order of importance, each capped by the time left (K3_DEADLINE seconds)
    left() { echo $(( ${K3_DEADLINE:-560} - SECONDS )); }
    echo "== 1. GPU tests (kernels vs CPU scalar, k3-nano on the GPU, CPU vs GPU greedy)"
    K3_BIN=$K3 K3_LAB_BIN=$LAB timeout "${TEST_TIMEOUT:-240}" "$T" cuda 2>&1 | tee "$OUT/tests_cuda.log" | grep -v '^ok'
    echo "== 2. CPU fixture tests with the same binary"
    K3_BIN=$K3 K3_LAB_BIN=$LAB timeout 60 "$T" model 2>&1 | tail -1 | tee "$OUT/tests_model.log"
    local memcheck="SKIPPED"
    if command -v compute-sanitizer >/dev/null && [ "$(left)" -gt 300 ]; then
        echo "== 3. compute-sanitizer memcheck: k3 run on k3-nano on the GPU"
        timeout 90 compute-sanitizer --tool memcheck --error-exitcode 99 "$K3" run \
            --prompt-ids 1792,100,200,300 --max-new 4 --device cuda -q > "$OUT/memcheck.log" 2>&1
        memcheck="exit $? ($(grep -c 'Invalid\|ERROR SUMMARY' "$OUT/memcheck.log") error lines; $(grep 'ERROR SUMMARY' "$OUT/memcheck.log"))"
        tail -3 "$OUT/memcheck.log"
    fi

    local greedy="SKIPPED"
    if [ "${KERNELS_ONLY:-0}" = 1 ] && [ "${SKIP_BENCH:-0}" != 1 ] && [ "$(left)" -gt 40 ]; then
        echo "== 4-5. k3-lab bench-gpu, kernels alone"
        timeout "$(left)" "$LAB" bench-gpu 2>&1 | tee "$OUT/bench.txt"
    elif [ "${SKIP_BENCH:-0}" != 1 ] && [ "$(left)" -gt 150 ]; then
        echo "== 4. synthetic K3-shaped checkpoint (real widths, 4 layers, 32 experts, top-16)"
        if [ ! -f "$SCR/k3-synth/config.json" ]; then
            timeout "$(left)" "$LAB" synth "$SCR/k3-synth" --real --layers 4 --experts 32 --top-k 16 2>&1 | tail -1
        fi
        echo "== 5. k3-lab bench-gpu"
        timeout "$(left)" "$LAB" bench-gpu "$SCR/k3-synth" --tokens 32 --warmup 16 2>&1 | tee "$OUT/bench.txt"
        if [ "$(left)" -gt 60 ]; then
            echo "== 6. greedy tokens on the synthetic checkpoint, CPU vs GPU"
            local ids=1792,100,200,300,400
            timeout "$(left)" "$K3" run "$SCR/k3-synth" --prompt-ids $ids --max-new 6 --ids \
                --device cpu -q > "$SCR/cpu.ids" 2>"$OUT/greedy.err"
            timeout "$(left)" "$K3" run "$SCR/k3-synth" --prompt-ids $ids --max-new 6 --ids \
                --device cuda -q > "$SCR/gpu.ids" 2>>"$OUT/greedy.err"
            echo "cpu: $(cat "$SCR/cpu.ids")"
            echo "gpu: $(cat "$SCR/gpu.ids")"
            if [ -s "$SCR/cpu.ids" ] && cmp -s "$SCR/cpu.ids" "$SCR/gpu.ids"; then greedy="identical: $(cat "$SCR/gpu.ids")"
            else greedy="DIFFERENT or not run (see greedy.err)"; fi
        fi
    fi

    local wide="SKIPPED"
    if [ "${SKIP_WIDE:-0}" != 1 ] && [ -f "$SHARED/tools/make_k3_wide.py" ] &&
        python3 -c 'import numpy' 2>/dev/null && [ "$(left)" -gt 90 ]; then
        echo "== 7. k3-wide on the GPU"
        if [ ! -f "$SCR/k3-wide/config.json" ]; then
            timeout "$(left)" python3 "$SHARED/tools/make_k3_wide.py" "$SCR/k3-wide" 2>&1 | tail -2
        fi
        K3_BIN=$K3 K3_LAB_BIN=$LAB K3_DEVICE=cuda K3_WIDE_DIR=$SCR/k3-wide K3_WIDE_REF=$SHARED/fixtures/k3-wide/reference \
            K3_TEST_VERBOSE=1 timeout "$(left)" "$T" wide 2>&1 | tee "$OUT/tests_wide_cuda.log" | tail -8
        wide=$(tail -1 "$OUT/tests_wide_cuda.log")
        grep -E '^(FAIL|SKIPPED)' "$OUT/tests_wide_cuda.log" | head -5
    else
        echo "== 7. k3-wide SKIPPED (no generator at $SHARED/tools, no numpy, SKIP_WIDE=1 or no time left)"
    fi

    local streamed="SKIPPED"
    if [ "${SKIP_STREAM:-0}" != 1 ] && [ -f "$SCR/k3-synth/config.json" ] && [ "$(left)" -gt 60 ]; then
        echo "== 8. decode with a streamed spine (K3_GPU_LAYERS=0: every layer uploaded per token)"
        K3_GPU_LAYERS=0 timeout "$(left)" "$LAB" bench-gpu "$SCR/k3-synth" --tokens 8 --warmup 8 \
            --reps 3 > "$OUT/bench_streamed.txt" 2>&1
        streamed="exit $?"
        grep -E 'streamed|resident|^[0-9]+ |K3 extrapolated|wall clock' "$OUT/bench_streamed.txt" | tail -12
    fi

    echo
    echo "================ summary ================"
    cat "$OUT/machine.txt"
    echo "GPU tests:            $(tail -1 "$OUT/tests_cuda.log")"
    grep -E '^(FAIL|SKIPPED)' "$OUT/tests_cuda.log" | head -20
    echo "CPU fixture tests:    $(cat "$OUT/tests_model.log")"
    echo "memcheck (nano):      $memcheck"
    echo "k3-wide on the GPU:   $wide"
    echo "synthetic greedy:     CPU vs GPU $greedy"
    echo "streamed spine bench: $streamed"
    [ -f "$OUT/bench.txt" ] && grep -E 'copy D2D|q/k/v/g|o_proj|lm_head|mxfp4|sched|int8|KDA heads|MLA att|^KDA|^MLA|^MoE|K3 extrapolated|wall clock' "$OUT/bench.txt"
    [ -f "$OUT/bench_streamed.txt" ] && grep -E 'K3 extrapolated|wall clock' "$OUT/bench_streamed.txt" | sed 's/^/streamed: /'
    # the verdict: GPU tests all ran (none skipped) and passed, greedy tokens not different
    if grep -qE '^(FAIL|SKIPPED)' "$OUT/tests_cuda.log" || ! grep -qE '^[1-9][0-9]* passed, 0 failed$' "$OUT/tests_cuda.log" ||
        [[ $greedy == DIFFERENT* ]]; then
        echo "gpu-check: FAILED (see above and $OUT)"
        return 1
    fi
    echo "gpu-check: ok"
}

case "${1:-run}" in
prepare) prepare ;;
run) run ;;
-h|--help|help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
*) echo "usage: $0 [prepare|run] (default run; $0 --help explains both)" >&2; exit 2 ;;
esac
