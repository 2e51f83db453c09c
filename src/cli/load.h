/* load.h — loading the model for a command (run, chat, serve, quality): the engine with the
 * streaming install's expert source wired in (src/setup's fetcher; the engine knows nothing
 * of HTTP), and what a run installs on its session from the options: the router trace, the
 * profile line and the end-of-run summary. */
#ifndef K3_CLI_LOAD_H
#define K3_CLI_LOAD_H

#include <stdio.h>

#include "../engine/k3.h"
#include "../setup/setup.h"
#include "../store/store.h"
#include "opts.h"

struct k3_dist; /* src/dist/dist.h (make MPI=1) */

/* What k3_cli_model_load returns on ranks 1..N-1 of an MPI run once rank 0 has ended the run
 * (they served it; main exits 0). */
#define K3_CLI_FOLLOWED 200

typedef struct k3_cli_model {
    k3_engine *e;
    struct k3_dist *dist;       /* an MPI run of several ranks (make MPI=1), else NULL */
    char rank_dirs[8192];       /* --dirs with %r replaced by this rank */
    k3_stream *stream;          /* a streaming install's missing experts, or NULL */
    k3_expert_source source;    /* reads them through stream */
    char dirs[8192];            /* the shard folders: --dirs + DIR/.k3/partial */
} k3_cli_model;

/* Loads model_dir with eo (eo->dirs and eo->expert_source are set here when model_dir is a
 * streaming install; m must stay in place while the engine lives). With eo->verbose, also
 * prints the install's line.
 * Under mpirun with more than one process (a build with MPI=1, src/dist/dist.h): every rank
 * loads, with "%r" in --dirs replaced by its rank and its expert store reading only its own
 * experts; rank 0 prints each rank's line and returns to the command; ranks 1..N-1 replay
 * rank 0's passes until it quits and then return K3_CLI_FOLLOWED with an empty message. A
 * rank that cannot load fails every rank (rank 0's message names it). cc->mpi_timeout
 * (--mpi-timeout, K3_MPI_TIMEOUT; default 60 s) bounds each exchange.
 * Errors: those of k3_stream_open and k3_engine_load; K3_ERR_USAGE for --mmap-experts on a
 * streaming install; K3_ERR_DIST. */
int k3_cli_model_load(const char *model_dir, k3_engine_opts *eo, const k3_cli_common *cc,
                      k3_cli_model *m, k3_err *err);
/* Frees the engine, then the stream. */
void k3_cli_model_free(k3_cli_model *m);

/* Checks, before any work, that path can be written by a later save (its folder exists and
 * is writable; path is not a folder). Errors: K3_ERR_IO naming flag and path. */
int k3_cli_check_writable(const char *flag, const char *path, k3_err *err);

/* What a run holds while the options are in effect. */
typedef struct k3_cli_store_run {
    const k3_cli_common *o;
    k3_session *s;
    FILE *trace;        /* --router-trace, or NULL */
    int profile;        /* lines per pass: 0 none, 1 one line, 2 also one per-layer line */
    struct k3_dist *dist; /* an MPI run: the summary adds one line per rank (set by the caller) */
    /* the prompt's progress line (k3_cli_prompt_begin): on a terminal only */
    int progress, shown;
    int prompt_end, first_pos; /* the position the prompt ends at; the first one computed */
    double t0, last_print;
} k3_cli_store_run;

/* Opens the router trace and installs the trace hook on s: the router trace, the profile,
 * and after every layer of a prompt pass the progress line and Ctrl-C (k3_cli_interrupted
 * stops the pass within a layer: K3_ERR_INTERRUPTED). Errors: K3_ERR_IO (trace file). */
int k3_cli_store_attach(k3_cli_store_run *r, k3_session *s, const k3_cli_common *o,
                        k3_err *err);
/* Prints the end-of-run summary (when verbose) and closes the trace. */
void k3_cli_store_finish(k3_cli_store_run *r, int verbose);
/* Around a prefill of a prompt ending at position `end`: on a terminal (stderr) the passes
 * print "prompt N/M ids, R ids/s, ETA" on one line, rewritten at most 5 times a second once
 * a second has passed; _end clears it. */
void k3_cli_prompt_begin(k3_cli_store_run *r, int end);
void k3_cli_prompt_end(k3_cli_store_run *r);

#endif
