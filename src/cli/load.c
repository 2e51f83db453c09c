/* load.c — see load.h. */
#include "load.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interrupt.h"
#include "../util/clock.h"

#ifdef K3_WITH_MPI
#include "../dist/dist.h"
#endif

/* ---- the streaming install's expert source ----------------------------------------------- */

static bool stream_local(void *user, const char *shard, uint64_t off, uint64_t len) {
    return k3_stream_in_shard(user, shard, off, len);
}

static int stream_read(void *user, int layer, int expert, const char *shard, uint64_t off,
                       uint64_t len, void *dst, k3_err *err) {
    return k3_stream_read(user, layer, expert, shard, off, len, dst, err);
}

/* An install made by `k3 setup --stream` (src/setup/setup.h): its incomplete shards are found
 * in DIR/.k3/partial, and the experts not yet on disk come from the network. */
#ifdef K3_WITH_MPI
/* dirs with every "%r" replaced by rank, into out. Errors: K3_ERR_USAGE (too long). */
static int rank_dirs(const char *dirs, int rank, char *out, size_t cap, k3_err *err) {
    size_t n = 0;
    for (const char *p = dirs; *p; p++) {
        int w = p[0] == '%' && p[1] == 'r' ? snprintf(out + n, cap - n, "%d", rank)
                                           : snprintf(out + n, cap - n, "%c", *p);
        if (w < 0 || (size_t)w >= cap - n)
            return k3_fail(err, K3_ERR_USAGE, "--dirs: longer than %zu bytes", cap - 1);
        n += (size_t)w;
        p += p[0] == '%' && p[1] == 'r';
    }
    out[n] = 0;
    return K3_OK;
}

/* Under mpirun with several processes: MPI up, the hooks in eo, the rank's --dirs. */
static int mpi_begin(k3_engine_opts *eo, const k3_cli_common *cc, k3_cli_model *m,
                     k3_err *err) {
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") && !getenv("PMIX_RANK"))
        return K3_OK; /* not launched by mpirun: one process, exactly as without MPI */
    double timeout = cc && cc->mpi_timeout > 0 ? cc->mpi_timeout : 60;
    int rc = k3_dist_open(timeout, &m->dist, err);
    if (rc || !m->dist) return rc;
    int rank = k3_dist_rank(m->dist);
#ifdef K3_TEST_CONTROLS
    /* The test build only (make k3-test; tests/mpi/run.sh): the shipped k3 reads no test
     * variable */
    const char *stall = getenv("K3_TEST_MPI_STALL_LAYER");
    if (stall && stall[0]) k3_dist_test_stall(m->dist, atoi(stall));
#endif
    if (eo->dirs && (rc = rank_dirs(eo->dirs, rank, m->rank_dirs, sizeof m->rank_dirs, err)))
        return rc;
    if (eo->dirs) eo->dirs = m->rank_dirs;
    eo->expert_ranks = k3_dist_expert_ranks(m->dist);
    eo->rank_ops = k3_dist_rank_ops(m->dist);
    if (rank != 0) eo->verbose = 0; /* rank 0 prints every rank's line */
    return K3_OK;
}

/* After every rank's load: rank 0 goes on; the others follow it, then say K3_CLI_FOLLOWED. */
static int mpi_started(int rc, int verbose, k3_cli_model *m, k3_err *err) {
    k3_err serr = {0};
    int rank = k3_dist_rank(m->dist);
    int st = k3_dist_start(m->dist, rc, err, m->e, m->rank_dirs[0] ? m->rank_dirs : NULL,
                           verbose, stderr, &serr);
    if (st) { /* rank 0 names the failed rank and exits with its status; the others exit 0
               * so that mpirun does not end rank 0 before it has said so */
        *err = serr;
        k3_cli_model_free(m);
        if (rank == 0) return st;
        err->msg[0] = 0;
        return K3_CLI_FOLLOWED;
    }
    if (rank == 0) return K3_OK;
    rc = k3_dist_follow(m->dist, m->e, err);
    k3_cli_model_free(m);
    if (rc) return rc;
    err->msg[0] = 0;
    return K3_CLI_FOLLOWED;
}
#endif

int k3_cli_model_load(const char *model_dir, k3_engine_opts *eo, const k3_cli_common *cc,
                      k3_cli_model *m, k3_err *err) {
    *m = (k3_cli_model){0};
#ifdef K3_WITH_MPI
    int verbose = eo->verbose;
    int mrc = mpi_begin(eo, cc, m, err);
    if (mrc) {
        k3_cli_model_free(m);
        return mrc;
    }
#endif
    k3_http_opts http = {.token = cc ? cc->hf_token : NULL};
    k3_stream_opts so = {.http = &http, .disk_budget_bytes = -1};
    if (cc && cc->expert_disk_gb >= 0) so.disk_budget_bytes = (int64_t)(cc->expert_disk_gb * 1e9);
    int rc = k3_stream_open_opts(model_dir, &so, &m->stream, err);
    if (!rc && m->stream) {
        if (eo->experts_in_place)
            rc = k3_fail(err, K3_ERR_USAGE, "%s is a streaming install: experts cannot be "
                         "used in place (experts_in_place) while some are not on disk",
                         model_dir);
        snprintf(m->dirs, sizeof m->dirs, "%s%s%s/.k3/partial", eo->dirs ? eo->dirs : "",
                 eo->dirs ? ":" : "", model_dir);
        eo->dirs = m->dirs;
        m->source = (k3_expert_source){m->stream, stream_local, stream_read};
        eo->expert_source = &m->source;
    }
    if (!rc) rc = k3_engine_load(model_dir, eo, &m->e, err);
#ifdef K3_WITH_MPI
    if (m->dist) { /* every rank learns whether every rank loaded */
        if ((rc = mpi_started(rc, verbose, m, err))) return rc;
    }
#endif
    if (rc) {
        k3_cli_model_free(m);
        return rc;
    }
    if (m->stream && eo->verbose) {
        char line[4096];
        k3_stream_describe(m->stream, line, sizeof line);
        fprintf(stderr, "k3: %s\n", line);
    }
    return K3_OK;
}

void k3_cli_model_free(k3_cli_model *m) {
    k3_engine_free(m->e);
    k3_stream_close(m->stream);
#ifdef K3_WITH_MPI
    k3_dist_close(m->dist); /* rank 0: the followers stop */
#endif
    m->e = NULL;
    m->stream = NULL;
    m->dist = NULL;
}

int k3_cli_check_writable(const char *flag, const char *path, k3_err *err) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return k3_fail(err, K3_ERR_IO, "%s %s: is a folder; give a file name", flag, path);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (access(dir, W_OK | X_OK) != 0)
        return k3_fail(err, K3_ERR_IO, "%s %s: cannot write there (%s: %s); give a path in a "
                       "writable folder", flag, path, dir, strerror(errno));
    return K3_OK;
}

/* ---- router trace, profile, summary ------------------------------------------------------- */

/* One JSON object per (step, layer), flushed so a killed run keeps every finished line. */
static void on_routing(void *user, int pos, int layer, const int *ids, const float *w, int k) {
    k3_cli_store_run *r = user;
    if (!r->trace) return;
    fprintf(r->trace, "{\"step\":%d,\"layer\":%d,\"ids\":[", pos, layer);
    for (int j = 0; j < k; j++) fprintf(r->trace, "%s%d", j ? "," : "", ids[j]);
    fprintf(r->trace, "],\"weights\":[");
    for (int j = 0; j < k; j++) fprintf(r->trace, "%s%.9g", j ? "," : "", w[j]);
    fprintf(r->trace, "]}\n");
    fflush(r->trace);
}

static void on_step(void *user, int pos) {
    k3_cli_store_run *r = user;
    if (!r->profile) return;
    k3_run_stats st;
    char line[512];
    k3_session_stats(r->s, &st);
    /* A batched pass calls this once per token after the whole pass: one line, at its last */
    if (st.last.tokens > 1 && pos + 1 != k3_session_pos(r->s)) return;
    k3_run_stats_profile(&st, line, sizeof line);
    fprintf(stderr, "k3: %s\n", line);
    if (r->profile < 2 || !st.layer_eload_s) return;
    fprintf(stderr, "k3: profile layers (expert wait / compute, ms):");
    for (int l = 0; l < st.n_layers; l++)
        if (st.layer_eload_s[l] > 0 || st.layer_expert_s[l] > 0)
            fprintf(stderr, " %d:%.1f/%.1f", l, 1e3 * st.layer_eload_s[l],
                    1e3 * st.layer_expert_s[l]);
    fprintf(stderr, "\n");
}

/* After each layer of a prompt pass: the progress line, and Ctrl-C stops the pass. */
static int on_layer(void *user, int pos, int n, int layer, int n_layers) {
    k3_cli_store_run *r = user;
    if (k3_cli_interrupted) return 1;
    if (!r->progress || !r->prompt_end) return 0;
    double now = k3_now_s();
    if (r->first_pos < 0) r->first_pos = pos;
    if (now - r->t0 < 1.0 || now - r->last_print < 0.2) return 0;
    double done = pos + (double)n * (layer + 1) / n_layers, rate = (done - r->first_pos) / (now - r->t0);
    double left = rate > 0 ? (r->prompt_end - done) / rate : 0;
    fprintf(stderr, "\r\033[Kk3: prompt %.0f/%d ids, %.1f ids/s, ETA %dm%02ds", done, r->prompt_end,
            rate, (int)(left / 60), (int)left % 60);
    r->last_print = now, r->shown = 1;
    return 0;
}

void k3_cli_prompt_begin(k3_cli_store_run *r, int end) {
    r->prompt_end = end, r->first_pos = -1, r->shown = 0;
    r->t0 = k3_now_s(), r->last_print = 0;
}

void k3_cli_prompt_end(k3_cli_store_run *r) {
    if (r->shown) fprintf(stderr, "\r\033[K");
    r->prompt_end = 0, r->shown = 0;
}

int k3_cli_store_attach(k3_cli_store_run *r, k3_session *s, const k3_cli_common *o,
                        k3_err *err) {
    *r = (k3_cli_store_run){.o = o, .s = s, .profile = o->profile,
                            .progress = isatty(STDERR_FILENO)};
    if (o->router_trace && !(r->trace = fopen(o->router_trace, "w")))
        return k3_fail(err, K3_ERR_IO, "%s: cannot create the router trace: %s", o->router_trace,
                       strerror(errno));
    k3_trace t = {.user = r, .on_routing = r->trace ? on_routing : NULL,
                  .on_step = r->profile ? on_step : NULL, .on_layer = on_layer};
    k3_session_set_trace(s, &t);
    return K3_OK;
}

void k3_cli_store_finish(k3_cli_store_run *r, int verbose) {
    if (r->s && verbose) {
        k3_run_stats st;
        char line[1024];
        k3_session_stats(r->s, &st);
        k3_run_stats_summary(&st, line, sizeof line);
        fprintf(stderr, "k3: %s\n", line);
#ifdef K3_WITH_MPI
        k3_dist_summary(r->dist, &st, stderr);
#endif
    }
    if (r->trace) fclose(r->trace);
    r->trace = NULL;
}
