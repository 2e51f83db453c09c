/* setup.h — installing a Kimi K3 snapshot over HTTP (`k3 setup`), and fetching routed
 * experts on demand into a streaming install. Three parts, one module:
 *
 *   1. k3_http   — a libcurl range-fetch client with a small pool of keep-alive
 *                  connections: exact byte ranges into memory or a file, with retries.
 *   2. k3_setup  — `k3 setup DEST --full | --stream | --finish | --check`.
 *   3. k3_stream — the run-time side of a streaming install: which experts are local,
 *                  and one HTTP range request per missing expert into a raw-span file.
 *
 * The source is any server laid out like the Hugging Face hub:
 *   {endpoint}/{repo}/resolve/{revision}/{file}
 *
 * Invariants (each has a test in tests/setup/run.sh):
 *  - Nothing that a server sent is kept unless it was checked: the status (206 for a range,
 *    200 for a whole file), Content-Range equal to the range asked for, and the length.
 *    These are checked before the first body byte is written; a response failing them
 *    writes nothing. A truncated body is never taken for a complete one.
 *  - Every file appears under its final name only when complete and checked (length, and
 *    sha256 when the server gave one: an X-Linked-Etag or ETag that is 64 hex digits, as on
 *    the Hugging Face hub). Until then it lives under a temporary name, so a crash never
 *    leaves a file that looks complete but is not.
 *  - A journal entry saying "these bytes of a partial shard are final" is written only after
 *    the bytes were fdatasync'd; a crash loses at most unjournaled progress, which is fetched
 *    again, never trusted.
 *  - Requests go only to the configured endpoint. Redirects are followed only to https: or
 *    to the endpoint's own host, and the bearer token is sent only to the endpoint's host.
 *    No message ever contains the token (URLs are printed without user:password@).
 *  - On-demand streaming costs exactly one HTTP request per missing expert (redirect
 *    targets are cached, so a hub that redirects to a CDN still costs one).
 *  - One install is one commit: when the server says which commit a branch resolves to
 *    (X-Repo-Commit, as the hub does), every later URL names that commit, and a file whose
 *    size differs from the recorded one is refused, so later fetches never mix versions.
 *
 * ---- On-disk layout of an install (DEST) ------------------------------------------------
 *
 *   config.json, model.safetensors.index.json,      complete, checked files
 *   tiktoken.model, tokenizer_config.json,
 *   generation_config.json (when the source has one)
 *   model-XXXXX-of-YYYYYY.safetensors               a complete, checked shard
 *   .k3/setup.json                                  the manifest (below)
 *   .k3/partial/model-XXXXX-of-YYYYYY.safetensors   a shard not yet complete, under its own
 *                                                   name: full length, sparse; only the byte
 *                                                   ranges in its journal are final, the rest
 *                                                   are holes
 *   .k3/<shard>.done                                its journal: records of two little-endian
 *                                                   u64 (offset, length) of final bytes; a
 *                                                   torn last record is ignored
 *   .k3/experts/<layer>/<expert>.bin                raw-span cache: the expert's span verbatim
 *                                                   (shard bytes [span.offset, span.offset +
 *                                                   span.nbytes)); present = complete (written
 *                                                   to a temporary name, length-checked,
 *                                                   renamed); within a disk budget
 *                                                   (k3_stream_opts)
 *   *.k3tmp                                         a small file being written (then renamed)
 *
 * Nothing incomplete ever sits in DEST under a shard's name, so another tool reading DEST
 * fails loudly instead of reading holes. k3 itself opens a streaming install by adding
 * DEST/.k3/partial to the loader's shard folders (k3_checkpoint_open_dirs, as K3_DIRS) and
 * reading experts through the store's expert source (k3_stream_*), never in place.
 *
 * A --full install is the complete shards plus the manifest. A --stream install has, for every
 * shard holding a routed expert, a partial shard whose journal covers the safetensors header
 * and every text spine tensor (vision tensors and routed experts are holes); a shard that is
 * all spine is complete. An expert is LOCAL when its shard is complete, or its span lies inside
 * its partial shard's journaled ranges, or its raw-span file exists. `--finish` copies raw
 * spans into the partial shards, fetches the rest in file-offset order, checks each shard and
 * renames it into place, after which the install is identical to a --full one.
 *
 * The expert span of (layer, expert) is [min begin, max end) over the file offsets of its
 * tensors (block_sparse_moe.experts.E.*); in K3 the six tensors are back to back, so the
 * span is exactly their bytes (spec §10.5). A tensor of that expert lies at
 * (tensor.file_offset - span.offset) inside the raw-span file.
 *
 * .k3/setup.json (written atomically): {"format": 1, "endpoint", "repo", "revision" (what
 * URLs use: the pinned commit when known), "ref" (the revision asked for, e.g. "main"),
 * "mode": "full"|"stream", "network": {"connections", "retries", "backoff_s", "timeout_s"}
 * (the --connections/--retries/--backoff/--timeout of the last `k3 setup`, used again when
 * experts stream at run time), "files": [{"name", "bytes", "sha256" (or null)}], "shards":
 * [{"name", "bytes", "sha256" (or null), "header_bytes"}]}. The token is never stored.
 */
#ifndef K3_SETUP_H
#define K3_SETUP_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "../util/err.h"

#define K3_HF_ENDPOINT "https://huggingface.co"
#define K3_HF_REPO "moonshotai/Kimi-K3"
#define K3_HF_REVISION "main"

/* ==== 1. HTTP range-fetch client =========================================================== */

typedef struct k3_http k3_http;

/* The slowest transfer k3 setup waits for (bytes per second): an attempt that has not
 * completed within --timeout plus its bytes at this rate is retried (a hub dripping bytes). */
#define K3_SETUP_MIN_RATE (16 * 1024)

typedef struct k3_http_opts {
    const char *endpoint;     /* origin the user configured, e.g. "https://huggingface.co" */
    const char *token;        /* bearer token (HF_TOKEN) or NULL; sent only to endpoint's host */
    int connections;          /* keep-alive connections = parallel transfers (0: 4) */
    int retries;              /* extra attempts on retryable failures (0: 5; -1: none) */
    double backoff_s;         /* delay before the first retry, doubled each time (0: 0.5 s) */
    double timeout_s;         /* connect timeout, and a transfer with no byte for this long
                                 fails and is retried (0: 30 s); an attempt also has a
                                 deadline: timeout_s plus its bytes at K3_SETUP_MIN_RATE */
    volatile sig_atomic_t *interrupt; /* when *interrupt != 0, transfers stop: K3_ERR_INTERRUPTED */
    /* Called on the fetching thread for every body byte range written (progress bars). */
    void (*on_bytes)(void *user, uint64_t nbytes);
    void *user;
    FILE *log;                /* one line per retry ("k3 setup: retrying WHAT in S s (attempt
                                 N of M): why"); NULL: retries are silent */
} k3_http_opts;

/* One request: the byte range [offset, offset + nbytes) of url, or the whole file when
 * nbytes == 0. The body goes to exactly one sink:
 *   dst      — memory of nbytes (range requests);
 *   fd >= 0  — a file, pwrite at file_offset + (byte - offset) (range requests);
 *   neither  — a malloc'd buffer returned in *body (whole-file requests, at most max_bytes).
 * A retried range request asks only for the bytes not yet received (done). */
typedef struct k3_http_req {
    const char *url;
    uint64_t offset, nbytes;
    void *dst;
    int fd;                   /* -1 when unused (set it: 0 is a valid descriptor) */
    uint64_t file_offset;
    uint64_t max_bytes;       /* whole-file requests: refuse bodies larger than this */
    uint64_t expect_total;    /* if nonzero, the file size the server must report */
    const char *what;         /* for messages, e.g. "expert 17 of layer 3"; may be NULL */
    bool not_found_ok;        /* a 404 is a result (status 404), not an error */
    /* results */
    char *body;               /* whole-file requests: the body, NUL-terminated; free() it */
    uint64_t done;            /* body bytes received, checked and written */
    uint64_t total_bytes;     /* file size from Content-Range or Content-Length */
    char sha256[65];          /* lowercase hex from X-Linked-Etag/ETag when it is one, else "" */
    char repo_commit[41];     /* X-Repo-Commit (the commit a branch resolved to), else "" */
    int status;               /* final HTTP status */
    int attempts;             /* requests made, redirect hops excluded */
} k3_http_req;

/* Creates a client. Errors: K3_ERR_USAGE (endpoint not an http(s) URL), K3_ERR_GENERIC. */
int k3_http_new(const k3_http_opts *o, k3_http **out, k3_err *err);
void k3_http_free(k3_http *h);

/* Runs the n requests over the pool (up to `connections` at once, keep-alive) and returns
 * when all succeeded or one failed for good. on_done (may be NULL) is called on this thread
 * as each request completes, in completion order; a nonzero return stops the batch with
 * that status. Thread-safe (one batch at a time; other callers wait).
 * Retryable: HTTP 5xx, 408, 429, timeouts, connection resets/refusals, a truncated body, a
 * Content-Range or length that does not match. Not retryable: other 4xx, redirects off the
 * endpoint's host to plain http, a body over max_bytes.
 * Errors: K3_ERR_NETWORK naming r->what, the URL (no credentials) and the last failure;
 * K3_ERR_INTERRUPTED; K3_ERR_IO (a pwrite failed); whatever on_done returned. */
int k3_http_fetch(k3_http *h, k3_http_req *reqs, int n,
                  int (*on_done)(void *user, k3_http_req *r, k3_err *err), void *user,
                  k3_err *err);

/* Requests made by this client so far (every attempt and redirect hop), and body bytes. */
void k3_http_stats(const k3_http *h, uint64_t *requests, uint64_t *bytes);

/* "{endpoint}/{repo}/resolve/{revision}/{file}" into buf. Returns buf ("" if it does not fit). */
char *k3_hub_url(char *buf, size_t cap, const char *endpoint, const char *repo,
                 const char *revision, const char *file);

/* url without "user:password@" (for messages). Returns buf. */
char *k3_url_for_humans(char *buf, size_t cap, const char *url);

/* ==== 2. k3 setup ========================================================================= */

enum k3_setup_mode {
    K3_SETUP_AUTO = 0,  /* --full when the disk has room, else --stream */
    K3_SETUP_FULL,      /* every shard */
    K3_SETUP_STREAM,    /* headers + text spine; experts arrive on demand */
    K3_SETUP_FINISH,    /* fetch every missing expert of an existing install */
    K3_SETUP_CHECK,     /* verify what is there; fetch nothing */
};

typedef struct k3_setup_opts {
    const char *dest;
    const char *endpoint, *repo, *revision; /* NULL: manifest's, else the K3_HF_* defaults */
    const char *token;                      /* NULL: no Authorization header */
    enum k3_setup_mode mode;
    int connections, retries;               /* see k3_http_opts (0: defaults) */
    double timeout_s, backoff_s;
    uint64_t chunk_bytes;                   /* largest single range request (0: 64 MiB) */
    int64_t free_bytes;                     /* < 0: ask the file system (statvfs); else assume */
    bool progress_bar;                      /* a redrawn bar (a terminal), else plain lines */
    FILE *log;                              /* progress and summaries (NULL: stderr) */
    volatile sig_atomic_t *interrupt;
} k3_setup_opts;

/* Runs `k3 setup` in o->mode. Install modes fetch config.json, the index, the tokenizer
 * files and every shard's header first (into memory), plan, check free space, then write.
 * Errors: K3_ERR_NO_SPACE (message gives the exact bytes to free), K3_ERR_NETWORK,
 * K3_ERR_IO, K3_ERR_CHECKPOINT (a header or index the server sent is malformed; --check
 * found a bad file), K3_ERR_USAGE (DEST holds another repo/revision; --finish without an
 * install), K3_ERR_INTERRUPTED (resumable: run the same command again). */
int k3_setup_run(const k3_setup_opts *o, k3_err *err);

/* ==== 3. Run-time streaming ================================================================ */

typedef struct k3_stream k3_stream;

/* One routed expert's bytes in its shard (see "expert span" above). */
typedef struct k3_expert_span {
    int layer, expert;
    int shard;                /* index into the install's shard list (k3_stream_shard_name) */
    uint64_t offset, nbytes;  /* absolute file offset in the shard, and length */
} k3_expert_span;

/* Opens the streaming state of the install in dir. *out = NULL (and K3_OK) when dir is not
 * a streaming install (no .k3/setup.json, or every shard complete): read it as a snapshot.
 * Endpoint, repository, revision and network settings come from the manifest; http (may be
 * NULL) supplies only token, interrupt and on_bytes.
 * Errors: K3_ERR_IO, K3_ERR_CHECKPOINT (manifest or journal malformed). */
int k3_stream_open(const char *dir, const k3_http_opts *http, k3_stream **out, k3_err *err);

/* How the experts fetched at run time are kept in DEST/.k3/experts (the raw-span cache). */
typedef struct k3_stream_opts {
    const k3_http_opts *http;  /* as k3_stream_open's http (may be NULL) */
    /* Bytes the raw-span files may take, temporary files being written included:
     *   < 0  the default: what DEST's file system has free at open (plus what is kept
     *        already) less a margin of max(10% of the file system, min(20 GB, 25% of it));
     *   0    keep nothing: every expert not in a shard is fetched each time it is read;
     *   > 0  exactly this many bytes.
     * When a new expert does not fit, kept experts are evicted (their files unlinked), least
     * recently used first (why not the RAM cache's S3-FIFO: setup_internal.h, sn_disk); one
     * that is being fetched, written or read is never evicted, and an expert that does not
     * fit beside those is served without being kept (so is one whose write finds the disk
     * full). The budget is applied at open too (kept files beyond it are evicted). One
     * process per install: two processes streaming into one DEST each keep their own count. */
    int64_t disk_budget_bytes;
} k3_stream_opts;

/* k3_stream_open with the raw-span cache's budget (o may be NULL: the defaults).
 * Errors: as k3_stream_open; K3_ERR_IO also when the default budget cannot read the free
 * space of DEST's file system. */
int k3_stream_open_opts(const char *dir, const k3_stream_opts *o, k3_stream **out, k3_err *err);
void k3_stream_close(k3_stream *s);

/* The raw-span cache against its budget: bytes now (files and writes in progress), the most
 * ever since open, the budget, and experts evicted since open. */
typedef struct k3_stream_disk {
    uint64_t kept_bytes, peak_bytes, budget_bytes, evicted;
} k3_stream_disk;
void k3_stream_disk_get(const k3_stream *s, k3_stream_disk *out);

/* The path of shard `name` (a file name from the index): the complete shard if present, else
 * its partial file. Returns buf. */
char *k3_stream_shard_path(const k3_stream *s, const char *name, char *buf, size_t cap);

/* True when the span's bytes are final in the shard file (complete shard, or journaled). */
bool k3_stream_in_shard(const k3_stream *s, const char *shard_name, uint64_t offset,
                        uint64_t nbytes);

/* Reads bytes [offset, offset + nbytes) of shard_name, which lie inside the span of expert
 * (layer, expert), into dst: from the shard when journaled there, else from the expert's
 * raw-span file, else with ONE HTTP range request for the whole span, whose body is checked,
 * kept as the raw-span file (temporary name, fdatasync, rename) and copied to dst. Thread-safe;
 * concurrent callers use separate keep-alive connections (up to the install's connections).
 * Errors: K3_ERR_NETWORK naming the expert and the URL (after the install's retries);
 * K3_ERR_IO; K3_ERR_CHECKPOINT (the range is not that expert's, per the install's headers). */
int k3_stream_read(k3_stream *s, int layer, int expert, const char *shard_name,
                   uint64_t offset, uint64_t nbytes, void *dst, k3_err *err);

/* Counts for the startup line: experts local / all, and bytes a --finish would fetch. */
typedef struct k3_stream_summary {
    uint64_t experts_local, experts_total, finish_bytes;
} k3_stream_summary;
void k3_stream_summary_get(const k3_stream *s, k3_stream_summary *out);

/* One line for the startup banner: experts local, what finishing would fetch, the command,
 * and the raw-span cache's budget (how it was set, bytes kept, the eviction order). */
void k3_stream_describe(const k3_stream *s, char *buf, size_t cap);

/* Experts fetched over HTTP since k3_stream_open, and HTTP requests made for them (every
 * attempt and redirect hop): equal when nothing was retried (tests, benchmarks). */
uint64_t k3_stream_fetched(const k3_stream *s);
uint64_t k3_stream_requests(const k3_stream *s);

/* The install's expert spans, sorted by shard and offset (*n of them); their shard field
 * indexes k3_stream_shard_name. For tools and benchmarks. */
const k3_expert_span *k3_stream_spans(const k3_stream *s, int *n);
const char *k3_stream_shard_name(const k3_stream *s, int shard);

/* ==== 4. Models by name (byname.c) ======================================================== *
 *
 * `k3 run moonshotai/Kimi-K3`: a repository id names a snapshot that the Hugging Face tools
 * downloaded into their hub cache,
 *     {hub_cache}/models--OWNER--NAME/snapshots/COMMIT/FILE  (a symlink into ../../blobs/)
 *     {hub_cache}/models--OWNER--NAME/refs/REF               (the commit branch or tag REF
 *                                                            was: refs/main, refs/refs/pr/1)
 * or, failing that, the folder `k3 setup` installs into by default: {models_dir}/OWNER/NAME.
 * `OWNER/NAME@REV` pins a revision: REV is a branch or tag as refs/ stores it (main, v1.0,
 * refs/pr/1), or a commit (40 hex digits, or 7 or more of its first, as git shortens them).
 * In the hub cache it is refs/REV's commit, else snapshots/REV, else the one snapshot whose
 * name begins with REV. Under models_dir it is {models_dir}/OWNER/NAME@REV (where `k3 setup
 * OWNER/NAME@REV` installs a revision other than main: k3_setup_default_dest) or
 * {models_dir}/OWNER/NAME, either only when its manifest (.k3/setup.json) records REV as the
 * revision asked for or the commit pinned (or a 7+ digit prefix of it).
 * The caller (the edge) finds hub_cache and models_dir from the environment with
 * k3_hub_cache_dir and k3_models_dir; nothing here reads the environment.
 *
 * Invariants (tests/test_byname.c):
 *  - An existing path is never reinterpreted, and a string that is not a repository id
 *    (OWNER/NAME, one slash, [A-Za-z0-9._-], no leading '.' or '-', no ".." or "--") is
 *    returned unchanged: folders keep working exactly as before.
 *  - Only a complete snapshot is used: config.json, tiktoken.model, tokenizer_config.json,
 *    the index and every shard its weight_map names (model.safetensors without an index),
 *    symlinks followed; a link whose blob is gone is missing. The hub's tools create a
 *    snapshot's link only once its blob is complete, so a download in progress is missing.
 *  - Newest: refs/main's snapshot first when complete, then the others by modification time
 *    (newest first; ties by name, so the choice is deterministic).
 *  - Several snapshots, none complete: an error naming what the newest lacks (its first 8
 *    files, and how many) and the fix (finish the download, or k3 setup).
 *  - A pinned revision is that revision or an error, never another one: incomplete, it is an
 *    error naming what it lacks; a short commit beginning two snapshots is an error naming
 *    both; an install whose manifest records another revision (or none) is not taken for it.
 */

/* Whether s has the form of a Hugging Face repository id (above). */
bool k3_repo_id_valid(const char *s);

/* Whether s is a model name, OWNER/NAME or OWNER/NAME@REV (REV: '/'-separated parts of
 * [A-Za-z0-9._-], none empty or starting with '.', at most 200 characters). When it is, repo
 * (cap bytes; may be NULL) receives OWNER/NAME and *rev (may be NULL) points at REV in s, or
 * is NULL when s has no '@'. */
bool k3_model_name_split(const char *s, char *repo, size_t cap, const char **rev);

/* The hub cache folder as huggingface_hub finds it: hf_hub_cache (HF_HUB_CACHE), else
 * hf_home/hub (HF_HOME), else xdg_cache_home/huggingface/hub (XDG_CACHE_HOME), else
 * home/.cache/huggingface/hub. Each argument may be NULL or "" (unset); a relative value
 * counts as unset. Returns buf: "" when none is known or it does not fit in cap. */
char *k3_hub_cache_dir(char *buf, size_t cap, const char *hf_hub_cache, const char *hf_home,
                       const char *xdg_cache_home, const char *home);

/* Where `k3 setup` installs by default: k3_models (K3_MODELS), else
 * xdg_data_home/k3/models, else home/.local/share/k3/models; a repository OWNER/NAME then
 * goes into {that}/OWNER/NAME. Same conventions as k3_hub_cache_dir. */
char *k3_models_dir(char *buf, size_t cap, const char *k3_models, const char *xdg_data_home,
                    const char *home);

/* The folder arg names: arg itself when it exists or is no model name (OWNER/NAME[@REV]);
 * else the newest complete snapshot of that repository in hub_cache (of REV: that revision's,
 * complete); else models_dir/OWNER/NAME when it holds a config.json (a full or streaming
 * install; for @REV, the install that records REV, above). hub_cache and models_dir may be
 * NULL or "". On success out (cap bytes) holds the folder, and note (if non-NULL) a line to
 * show the user when a newer but incomplete snapshot was passed over ("" otherwise).
 * Errors: K3_ERR_IO when nothing is found (the message names every place looked at and what
 * each holds, and the fix) or no snapshot is complete (what the newest lacks) or REV's is
 * incomplete (what it lacks); K3_ERR_USAGE for a REV of the wrong form or a short commit
 * beginning several snapshots (it names two); K3_ERR_CHECKPOINT for an index that is not
 * JSON with a weight_map of plain file names, or a malformed .k3/setup.json. */
int k3_model_resolve(const char *arg, const char *hub_cache, const char *models_dir, char *out,
                     size_t cap, char *note, size_t note_cap, k3_err *err);

#endif
