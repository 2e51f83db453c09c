/* bench_mpi_exchange.c — the expert exchange of an MPI run (src/dist) alone, at K3's sizes, to
 * time the transport without the compute around it (scripts/bench-mpi.sh builds and runs it).
 *
 * Per token, for each of `layers` MoE layers: top-k distinct expert ids of `experts` are drawn
 * (a fixed LCG, the same on every rank), expert e of layer l is owned by rank (e + l) mod N
 * (k3_expert_owner), and every rank sends its owned experts' latent outputs (latent floats
 * each, plus the 16-byte header src/dist sends) to every other rank and receives theirs: the
 * messages src/dist/dist.c exchanges, with MPI_Waitall instead of its polled deadline.
 * Prints, for rank 0: ms per token, µs per layer, bytes sent per token per rank (mean over
 * ranks) and the effective per-rank send rate.
 * Usage: mpirun -np N bench_mpi_exchange [tokens=50] [layers=92] [experts=896] [topk=16]
 *        [latent=3584] */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int N, me;
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    int tokens = argc > 1 ? atoi(argv[1]) : 50, layers = argc > 2 ? atoi(argv[2]) : 92;
    int E = argc > 3 ? atoi(argv[3]) : 896, K = argc > 4 ? atoi(argv[4]) : 16;
    int lat = argc > 5 ? atoi(argv[5]) : 3584;
    size_t hdr = 16, cap = hdr + (size_t)K * lat * sizeof(float);
    char *sbuf = calloc(1, cap), *rbuf = calloc((size_t)N, cap);
    MPI_Request *req = calloc(2 * (size_t)N, sizeof *req);
    int *ids = calloc((size_t)K, sizeof *ids), *count = calloc((size_t)N, sizeof *count);
    if (!sbuf || !rbuf || !req || !ids || !count) return 1;
    uint64_t lcg = 12345, sent = 0;
    double t_all = 0;
    for (int t = -3; t < tokens; t++) { /* 3 warm-up tokens */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int l = 0; l < layers; l++) {
            for (int j = 0; j < K; j++) { /* K distinct ids */
                int e, dup;
                do {
                    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
                    e = (int)((lcg >> 33) % (uint64_t)E);
                    dup = 0;
                    for (int i = 0; i < j; i++) dup |= ids[i] == e;
                } while (dup);
                ids[j] = e;
            }
            memset(count, 0, (size_t)N * sizeof *count);
            for (int j = 0; j < K; j++) count[(ids[j] + l) % N]++;
            size_t sb = hdr + (size_t)count[me] * lat * sizeof(float);
            int n = 0;
            for (int p = 0; p < N; p++)
                if (p != me)
                    MPI_Irecv(rbuf + (size_t)p * cap, (int)cap, MPI_BYTE, p, 12, MPI_COMM_WORLD,
                              &req[n++]);
            for (int p = 0; p < N; p++)
                if (p != me) {
                    MPI_Isend(sbuf, (int)sb, MPI_BYTE, p, 12, MPI_COMM_WORLD, &req[n++]);
                    if (t >= 0) sent += sb;
                }
            MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
        }
        double dt = MPI_Wtime() - t0, worst;
        MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (t >= 0) t_all += worst;
    }
    uint64_t total = 0;
    MPI_Reduce(&sent, &total, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (me == 0) {
        double per_rank = (double)total / N / tokens, ms = 1e3 * t_all / tokens;
        printf("ranks %d, %d MoE layers x top-%d of %d, latent %d: %.3f ms/token (%.1f us/layer),"
               " %.2f MB sent per rank per token (%.2f GB/s per rank)\n", N, layers, K, E, lat,
               ms, 1e3 * ms / layers, per_rank / 1e6, per_rank / 1e9 / (ms / 1e3));
    }
    free(sbuf);
    free(rbuf);
    free(req);
    free(ids);
    free(count);
    MPI_Finalize();
    return 0;
}
