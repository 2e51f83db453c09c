#!/bin/sh
# bench-mpi.sh [K3_WIDE_DIR] — the expert-parallel run's costs on this host (BENCHMARKS.md,
# "Expert parallelism over MPI"):
#  1. the expert exchange alone at K3's sizes (scripts/bench_mpi_exchange.c: 92 MoE layers,
#     top-16 of 896, latent 3584 floats) for 2, 3 and 4 ranks, over shared memory (Open MPI's
#     default on one host) and over TCP loopback (--mca btl tcp,self: the path between hosts);
#  2. with K3_WIDE_DIR (k3-wide: K3's real widths, 4 layers): `k3 run` under 1, 2 and 3 ranks
#     with O_DIRECT expert reads and a small cache, so every rank reads its own experts from
#     the disk: the per-rank summary lines (hit rate, GB read, read GB/s, communication per
#     token). All ranks share this host's one disk.
# Needs make MPI=1 (build-mpi/k3) and ./k3.
set -eu
cd "$(dirname "$0")/.."
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
OUT=${TMPDIR:-/tmp}/k3-bench-mpi
mkdir -p "$OUT"
mpicc -O2 -Wall -Wextra -Werror -o "$OUT/bench_mpi_exchange" scripts/bench_mpi_exchange.c
echo "== the exchange alone (50 tokens) =="
for np in 2 3 4; do
    printf "shm: "; $MPIRUN -np $np "$OUT/bench_mpi_exchange" 50
    printf "tcp: "; $MPIRUN --mca btl tcp,self -np $np "$OUT/bench_mpi_exchange" 50
done
[ $# -ge 1 ] || exit 0
WIDE=$1
echo "== k3 run on $WIDE: 3 generated tokens, --direct 1, --expert-gb 0.4, 1 thread per rank =="
ARGS="--prompt-ids 1,2 --max-new 3 --direct 1 --expert-gb 0.4 --threads 1 --pipe off"
./k3 run "$WIDE" $ARGS >"$OUT/np1.out" 2>"$OUT/np1.err"
grep -E "time:|generated" "$OUT/np1.err"
for np in 2 3; do
    $MPIRUN -np $np -x OMP_WAIT_POLICY build-mpi/k3 run "$WIDE" $ARGS \
        --dump-logits "$OUT/np$np.bin" >"$OUT/np$np.out" 2>"$OUT/np$np.err"
    grep -E "generated|rank [0-9] on" "$OUT/np$np.err"
    cmp "$OUT/np1.out" "$OUT/np$np.out" && echo "np $np: tokens identical to one process"
done
