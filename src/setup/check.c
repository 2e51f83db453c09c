/* check.c — `k3 setup DEST --check`: verifies what an install holds, fetching nothing.
 * Complete files: length, and sha256 when the server gave one at download time. Shards: the
 * header parses and every tensor lies inside the file; a .partial's journal covers its header
 * (and, for a streaming install, the text spine). Raw-span files: exact span length (a bad
 * one is deleted: it is only a cache and will be fetched again). */
#include "setup_internal.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct checker {
    FILE *log;
    int problems;
    sn_progress prog;
} checker;

static void bad(checker *k, const char *fmt, const char *a, const char *b) {
    k->problems++;
    if (k->prog.bar) fputc('\n', k->log);
    fprintf(k->log, "BAD  ");
    fprintf(k->log, fmt, a, b);
    fputc('\n', k->log);
}

/* Length and (when known) sha256 of a complete file. */
static void check_file(checker *k, const char *dest, const char *name, uint64_t bytes,
                       const char *sha) {
    char path[4096], got[65];
    struct stat st;
    k3_err e = {0};
    sn_path(path, sizeof path, dest, name, NULL);
    if (stat(path, &st) != 0) {
        bad(k, "%s: missing%s", path, "");
        return;
    }
    if ((uint64_t)st.st_size != bytes) {
        char why[96];
        snprintf(why, sizeof why, " (%llu bytes, the source has %llu)",
                 (unsigned long long)st.st_size, (unsigned long long)bytes);
        bad(k, "%s: wrong length%s", path, why);
        return;
    }
    if (!sha[0]) return;
    if (sn_sha256_file(path, got, sn_progress_add, &k->prog, &e)) {
        bad(k, "%s: %s", path, e.msg);
        return;
    }
    if (strcmp(got, sha)) bad(k, "%s: sha256 differs from the server's %s: delete it and run "
                              "k3 setup again", path, sha);
}

/* Bytes --check will hash: complete files the server gave a sha256 for. */
static uint64_t hash_bytes(const sn_install *in) {
    uint64_t t = 0;
    char path[4096];
    struct stat st;
    for (int i = 0; i < in->n_files; i++) t += in->files[i].sha256[0] ? in->files[i].bytes : 0;
    for (int i = 0; i < in->n_shards; i++)
        if (in->shards[i].sha256[0] &&
            stat(sn_path(path, sizeof path, in->dest, in->shards[i].name, NULL), &st) == 0)
            t += in->shards[i].bytes;
    return t;
}

static void check_shard(checker *k, sn_install *in, sn_shard *sh, bool stream, int *n_complete,
                        int *n_partial) {
    k3_err e = {0};
    char path[4200];
    int rc = sn_load_shard(in->dest, sh, &e);
    if (rc) {
        bad(k, "%s%s", e.msg, "");
        return;
    }
    if (sh->complete) {
        (*n_complete)++;
        check_file(k, in->dest, sh->name, sh->bytes, sh->sha256);
        return;
    }
    if (sh->has_partial) sn_partial_path(path, sizeof path, in->dest, sh->name);
    else sn_path(path, sizeof path, in->dest, sh->name, NULL);
    if (!sh->has_partial) {
        bad(k, "%s: missing%s", path, stream ? " (run k3 setup again to fetch its spine)" : "");
        return;
    }
    (*n_partial)++;
    if (!sh->header) {
        bad(k, "%s: its header was never fetched%s", path, "");
        return;
    }
    for (int t = 0; stream && t < sh->nt; t++)
        if (sh->t[t].kind == SN_SPINE && !sn_ranges_covers(&sh->done, sh->t[t].begin,
                                                           sh->t[t].end)) {
            bad(k, "%s: spine tensor %s was never fetched (run k3 setup again)", path,
                sh->t[t].name);
            return;
        }
}

int sn_check(const k3_setup_opts *o, bool found, k3_err *err) {
    if (!found)
        return k3_fail(err, K3_ERR_USAGE, "%s has no k3 setup manifest (" SN_MANIFEST "): "
                       "nothing to check", o->dest);
    checker k = {.log = o->log ? o->log : stderr};
    sn_install in = {0};
    bool f2;
    int rc = sn_manifest_read(o->dest, &in, &f2, err); /* a private, mutable copy */
    if (rc) return rc;
    bool stream = !strcmp(in.mode, "stream");
    sn_progress_begin(&k.prog, k.log, o->progress_bar, "check", hash_bytes(&in));
    for (int i = 0; i < in.n_files; i++)
        check_file(&k, in.dest, in.files[i].name, in.files[i].bytes, in.files[i].sha256);
    int n_complete = 0, n_partial = 0;
    for (int i = 0; i < in.n_shards; i++)
        check_shard(&k, &in, &in.shards[i], stream, &n_complete, &n_partial);
    uint64_t local = 0;
    if (sn_build_spans(&in, err) == K3_OK) {
        for (int i = 0; i < in.n_spans; i++) {
            const k3_expert_span *sp = &in.spans[i];
            const sn_shard *sh = &in.shards[sp->shard];
            char path[4096];
            struct stat st;
            sn_span_path(path, sizeof path, in.dest, sp->layer, sp->expert);
            bool in_shard = sh->complete ||
                            sn_ranges_covers(&sh->done, sp->offset, sp->offset + sp->nbytes);
            bool cached = stat(path, &st) == 0;
            if (cached && (uint64_t)st.st_size != sp->nbytes) {
                bad(&k, "%s: wrong length for this expert's span; deleted (it will be "
                    "fetched again)%s", path, "");
                unlink(path);
                cached = false;
            }
            local += in_shard || cached;
        }
    } else {
        bad(&k, "%s%s", err->msg, "");
    }
    if (k.prog.total) sn_progress_end(&k.prog);
    fprintf(k.log, "k3 setup --check %s: %s install, %d files, %d of %d shards complete, %d "
            "partial, %llu of %d experts local: %s\n", in.dest, in.mode, in.n_files, n_complete,
            in.n_shards, n_partial, (unsigned long long)local, in.n_spans,
            k.problems ? "PROBLEMS FOUND" : "ok");
    if (k.problems)
        rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: %d problem%s (listed above)", in.dest,
                     k.problems, k.problems == 1 ? "" : "s");
    sn_install_free(&in);
    return rc;
}
