/* dist.h — expert parallelism over MPI (`make MPI=1`, issue 19): `mpirun -np N k3 run|chat|
 * serve ...` runs N processes (ranks) on one host or many; rank 0 tokenizes, samples, prints
 * and answers HTTP; ranks 1..N-1 follow it. Only this module calls MPI.
 *
 * Design (docs/ARCHITECTURE.md, "Expert parallelism"): every rank loads the whole spine and
 * runs every pass on the same ids, so every rank holds the same state; the routed experts are
 * partitioned (k3_expert_owner in model/pass.h: expert e of MoE layer l belongs to rank
 * (e + l) mod N) and each rank's store opens, caches, prefetches and reads only its own. At
 * each MoE layer every rank computes its chosen experts and sends their latent outputs to all
 * others (point to point, one message per peer, 4 bytes × latent per expert); each rank puts
 * every output in its router slot and sums in router order itself.
 *
 * Invariants:
 *  - Bit-identical to one process: an expert's output does not depend on which rank computed
 *    it (the same kernels on the same bytes), floats travel verbatim, and every rank sums the
 *    same rows in the same order (no MPI reduction, whose order MPI does not fix).
 *  - Every rank runs the same sequence of passes: rank 0's engine calls k3_rank_ops.send
 *    (engine/k3.h) before each pass (K3_ROP_PASS: every segment of it, so that a pass over
 *    several sessions — k3 serve --parallel — is replayed as one), rewind, reset, session
 *    creation and free, and the followers replay the ops in k3_dist_follow on the same path
 *    (a session's own pass, or a multistep's). The followers compute no logits (lm_head).
 *  - Nothing waits forever inside a pass: every exchange and op is nonblocking and polled
 *    against a deadline (timeout_s on rank 0, twice that on the others, so that rank 0
 *    names the lost rank first; a follower still waiting at half its deadline tells rank 0
 *    whom it waits on, so that rank 0, missing several ranks, names the one the others wait
 *    on); a peer that sends nothing by then is lost: the rank that
 *    sees it prints the error (naming rank and host) to stderr and ends the whole job with
 *    MPI_Abort, status K3_ERR_DIST (13) — the one exception to "only main exits": the other
 *    ranks wait on the lost one, and a rank that merely exited would leave them (and a
 *    stopped rank) to mpirun. A killed rank is usually seen first by mpirun, which ends the job
 *    naming rank, node and signal.
 *    A rank that fails (an expert it cannot read) sends its error instead of data, so every
 *    rank returns the same error for that pass, naming the failed rank; the run goes on.
 *  - Followers wait for rank 0's next op without a deadline (rank 0 may wait for a user).
 *  - MPI_THREAD_SERIALIZED: one thread at a time calls in (the server's worker thread, or
 *    main); OpenMP regions never call MPI.
 *  - One rank: k3_dist_open returns no k3_dist, and k3 runs exactly as without MPI.
 */
#ifndef K3_DIST_H
#define K3_DIST_H

#include <stdio.h>

#include "../engine/k3.h"
#include "../util/err.h"

typedef struct k3_dist k3_dist;

/* Initialises MPI (MPI_Init_thread, SERIALIZED) and learns the ranks' hosts. timeout_s: the
 * deadline of one exchange or op (> 0). *out is NULL (and MPI finalized) when the job has one
 * process. Errors: K3_ERR_DIST (MPI could not start or lacks thread support), K3_ERR_USAGE
 * (timeout_s not > 0). */
int k3_dist_open(double timeout_s, k3_dist **out, k3_err *err);

int k3_dist_rank(const k3_dist *d);
int k3_dist_size(const k3_dist *d);
const char *k3_dist_host(const k3_dist *d, int rank);

/* Tests only: the last rank, at its next exchange of MoE layer `layer`, sends its outputs to
 * rank 0 alone and stops itself (SIGSTOP) — a host lost after one peer heard from it and
 * before another did, which rank 0 must still name (not the peer left waiting on it). */
void k3_dist_test_stall(k3_dist *d, int layer);

/* The MoE's hook (model/pass.h) for k3_engine_opts.expert_ranks: every rank. */
const k3_expert_ranks *k3_dist_expert_ranks(k3_dist *d);
/* The op mirror for k3_engine_opts.rank_ops: rank 0 only (NULL on the others). */
const k3_rank_ops *k3_dist_rank_ops(k3_dist *d);

/* Every rank, once, after its engine load: status and err are its load's result, e its
 * engine (NULL when the load failed), dirs its shard folders (after the rank placeholder).
 * Rank 0 receives every rank's line (host, experts owned, expert bytes owned, cache, folders)
 * and prints them to f when verbose. Returns K3_OK when every rank loaded, else the first
 * failed rank's status with err naming rank, host and its message (on every rank).
 * Errors: K3_ERR_DIST and the failed rank's own. */
int k3_dist_start(k3_dist *d, int status, const k3_err *load_err, const k3_engine *e,
                  const char *dirs, int verbose, FILE *f, k3_err *err);

/* Ranks 1..N-1: replays rank 0's ops on e until rank 0 quits (k3_dist_close). A pass that
 * fails here fails on rank 0 too (the exchange carries the error), so it is not returned.
 * Errors: K3_ERR_DIST (an exchange timed out, MPI failed); K3_ERR_GENERIC (out of memory). */
int k3_dist_follow(k3_dist *d, const k3_engine *e, k3_err *err);

/* Rank 0: asks every follower for its counters and prints one line per rank to f: host,
 * expert hit rate, GB read, the wall time with a read in flight and the GB/s over it,
 * communication time per token (wall time inside exchanges: the transfer plus any wait for a
 * slower rank) and bytes sent per token. mine is rank 0's own (k3_session_stats). No effect
 * elsewhere. */
void k3_dist_summary(k3_dist *d, const k3_run_stats *mine, FILE *f);

/* Rank 0 tells the followers to stop; every rank finalizes MPI. d may be NULL. */
void k3_dist_close(k3_dist *d);

#endif
