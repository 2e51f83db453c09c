/* fuzz_state.c — a state file (`--load-state`, src/model/state_file.h) through
 * k3_session_load into a k3-nano session of 64 positions.
 *
 * The first byte picks what the harness repairs before the rest is written to a file, so
 * that mutations reach past the two checks a random file fails first:
 *   bit 0: the header's fingerprint (bytes 16..32) is set to k3-nano's;
 *   bit 1: the trailing XXH3-64 is recomputed over every byte before it;
 *   bit 2: the file is read as a cache reads its own (serve's --state-dir, issue 32):
 *          k3_session_load_prefix, expecting the seed's ids {1, 2, 3}.
 * Oracle: a load that succeeds leaves the session at the file's pos (<= 64), and one step
 * from there either succeeds or fails with an error (never a crash or a sanitizer report);
 * a cache's load that succeeds holds exactly the ids it expected, one that fails leaves the
 * session as it was (1 position); a load that fails leaves a session that still steps. */
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../src/engine/k3.h"
#include "fuzz_files.h"

#define STATE_CTX 64

static const int32_t ids[3] = {1, 2, 3}; /* the seed file's prefix */

typedef struct fuzz_state_ctx {
    k3_engine *e;
    k3_session *s;
    uint8_t fingerprint[16];
    char dir[256];
    float *logits;
} fuzz_state_ctx;

/* k3-nano, a session, and its fingerprint (from a file saved after a 3-id prefill). */
static fuzz_state_ctx *state_ctx(void) {
    static fuzz_state_ctx c;
    static int ready;
    if (ready) return ready > 0 ? &c : NULL;
    ready = -1;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    o.experts_in_place = 1;
    o.verbose = 0;
    if (k3_engine_load("tests/fixtures/k3-nano", &o, &c.e, &err) ||
        k3_session_new(c.e, STATE_CTX, &c.s, &err))
        return NULL;
    c.logits = malloc(sizeof(float) * (size_t)k3_engine_config(c.e)->vocab_size);
    k3_fuzz_dir("state", c.dir, sizeof c.dir);
    char path[320];
    snprintf(path, sizeof path, "%s/seed.k3state", c.dir);
    FILE *f = NULL;
    if (!c.logits || k3_session_prefill(c.s, ids, 3, c.logits, NULL, &err) ||
        k3_session_save(c.s, path, &err) || !(f = fopen(path, "rb")) ||
        fseek(f, 16, SEEK_SET) || fread(c.fingerprint, 1, 16, f) != 16) {
        if (f) fclose(f);
        return NULL;
    }
    fclose(f);
    ready = 1;
    return &c;
}

int k3_fuzz_state(const uint8_t *data, size_t size) {
    fuzz_state_ctx *c = state_ctx();
    if (!c || size < 1) return c ? 0 : -1;
    uint8_t *buf = malloc(size - 1 + 1);
    if (!buf) return 0;
    size_t n = size - 1;
    memcpy(buf, data + 1, n);
    if ((data[0] & 1) && n >= 32) memcpy(buf + 16, c->fingerprint, 16);
    if ((data[0] & 2) && n >= 8) {
        uint64_t h = XXH3_64bits(buf, n - 8);
        memcpy(buf + n - 8, &h, 8);
    }
    int bad = k3_fuzz_write(c->dir, "in.k3state", buf, n);
    free(buf);
    if (bad) return 0;
    char path[320];
    snprintf(path, sizeof path, "%s/in.k3state", c->dir);
    k3_err err = {0};
    int cache = data[0] & 4, rc;
    if (cache) {
        k3_session_reset(c->s);
        if (k3_session_step(c->s, 7, c->logits, &err)) return -1; /* one position to keep */
        rc = k3_session_load_prefix(c->s, path, ids, 3, &err);
    } else {
        rc = k3_session_load(c->s, path, &err);
    }
    int pos = k3_session_pos(c->s);
    if (rc == K3_OK && (pos < 0 || pos > STATE_CTX)) return -1;
    if (cache && rc == K3_OK && (pos != 3 || memcmp(k3_session_tokens(c->s), ids, sizeof ids)))
        return -1; /* a cache got other ids than it wrote */
    if (cache && (rc == K3_ERR_INPUT) && (pos != 1 || k3_session_tokens(c->s)[0] != 7))
        return -1; /* a refused file touched the session */
    if (pos >= STATE_CTX) k3_session_reset(c->s); /* full: nothing left to step */
    err = (k3_err){0};
    (void)k3_session_step(c->s, 5, c->logits, &err);
    k3_session_reset(c->s);
    return 0;
}

K3_FUZZ_ENTRY(k3_fuzz_state)
