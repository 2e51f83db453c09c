/* setup_internal.h — shared by the files of src/setup (not a public header): the model of an
 * install on disk (manifest, shard headers, journals, expert spans) and the progress display.
 * The layout itself is documented in setup.h. */
#ifndef K3_SETUP_INTERNAL_H
#define K3_SETUP_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "setup.h"

#define SN_DIR ".k3"
#define SN_MANIFEST ".k3/setup.json"
#define SN_PARTIAL_DIR ".k3/partial"
#define SN_INDEX "model.safetensors.index.json"
#define SN_SINGLE "model.safetensors"
#define SN_MAX_SMALL_BYTES (64u << 20)   /* config, index, tokenizer files */
#define SN_MAX_HEADER_BYTES (512u << 20) /* a safetensors JSON header */

/* ---- sets of byte ranges [a, b), sorted and merged ---------------------------------- */
typedef struct sn_ranges {
    uint64_t (*r)[2];
    int n, cap;
} sn_ranges;

int sn_ranges_add(sn_ranges *s, uint64_t a, uint64_t b);      /* 0, or ENOMEM */
bool sn_ranges_covers(const sn_ranges *s, uint64_t a, uint64_t b);
uint64_t sn_ranges_bytes(const sn_ranges *s);
/* out = [a, b) minus s (out is cleared first). */
int sn_ranges_missing(const sn_ranges *s, uint64_t a, uint64_t b, sn_ranges *out);
void sn_ranges_free(sn_ranges *s);

/* ---- the install ------------------------------------------------------------------- */
enum sn_kind { SN_SPINE, SN_EXPERT, SN_VISION };

typedef struct sn_tensor {
    char *name;
    uint64_t begin, end;      /* absolute file offsets */
    int kind, layer, expert;  /* layer/expert for SN_EXPERT */
} sn_tensor;

typedef struct sn_shard {
    char *name;
    uint64_t bytes, header_bytes;
    char sha256[65];          /* "" when the server gave none */
    char *header;             /* [0, header_bytes) raw; NULL until known */
    sn_tensor *t;
    int nt;
    bool complete;            /* the final file exists (and was checked when written) */
    bool has_partial;         /* .k3/partial/<name> exists */
    sn_ranges done;           /* journaled final bytes of the partial file */
} sn_shard;

typedef struct sn_file {
    char *name;
    uint64_t bytes;
    char sha256[65];
    bool optional;
} sn_file;

typedef struct sn_install {
    char *dest;
    char *endpoint, *repo, *revision; /* revision: what URLs use (the pinned commit when known) */
    char *ref;                /* the revision the user asked for (e.g. "main") */
    char mode[16];            /* "full" | "stream" | "" (unknown) */
    int net_connections, net_retries;   /* the manifest's "network" (0: defaults) */
    double net_backoff_s, net_timeout_s;
    sn_file *files;
    int n_files;
    sn_shard *shards;
    int n_shards;
    k3_expert_span *spans;    /* sorted by (shard, offset) */
    int n_spans;
    int n_layers_seen;        /* 1 + the largest layer index of an expert */
} sn_install;

void sn_install_free(sn_install *in);
char *sn_path(char *buf, size_t cap, const char *dest, const char *name, const char *suffix);
/* dest/.k3/partial/<shard>: where a shard lives until it is complete (same file name, so a
 * loader can find it through its extra-folders search; see setup.h). */
char *sn_partial_path(char *buf, size_t cap, const char *dest, const char *shard);
char *sn_journal_path(char *buf, size_t cap, const char *dest, const char *shard);
char *sn_span_path(char *buf, size_t cap, const char *dest, int layer, int expert);

/* Reads .k3/setup.json into in (dest, source, mode, files, shard names/sizes/sha256).
 * *found = false (K3_OK) when there is none. Errors: K3_ERR_CHECKPOINT (malformed). */
int sn_manifest_read(const char *dest, sn_install *in, bool *found, k3_err *err);
/* Writes it atomically (temporary name, fsync, rename). */
int sn_manifest_write(const sn_install *in, k3_err *err);

/* Parses a shard's raw header bytes ([0, header_bytes): u64 length + JSON) into sh->t,
 * classifying tensors; every tensor must end inside sh->bytes.
 * Errors: K3_ERR_CHECKPOINT naming the shard. Takes ownership of hdr. */
int sn_parse_header(sn_shard *sh, char *hdr, uint64_t hdr_bytes, k3_err *err);
/* Builds in->spans from the parsed headers. Errors: K3_ERR_CHECKPOINT (an expert's tensors
 * in two shards). */
int sn_build_spans(sn_install *in, k3_err *err);

/* For every shard of the manifest: whether it is complete, the journal of its .partial,
 * and its header read from the local file (complete or partial). Shards whose header is
 * not local yet keep header == NULL. Errors: K3_ERR_IO, K3_ERR_CHECKPOINT. */
int sn_load_local(sn_install *in, k3_err *err);
int sn_load_shard(const char *dest, sn_shard *sh, k3_err *err); /* one shard of it */

/* Reads the journal of shard into sh->done (a torn last record is ignored; a record past
 * the end of the shard discards the whole journal). */
int sn_journal_load(const char *dest, sn_shard *sh, k3_err *err);

/* sha256 of a whole file as 64 lowercase hex digits; *progress (may be NULL) adds bytes. */
int sn_sha256_file(const char *path, char out[65], void (*on_bytes)(void *, uint64_t),
                   void *user, k3_err *err);
void sn_sha256_mem(const void *p, size_t n, char out[65]);

/* Free bytes for an unprivileged writer in the file system holding dir. */
int sn_free_bytes(const char *dir, uint64_t *out, k3_err *err);
int sn_mkdirs(const char *path, k3_err *err);
/* Writes buf to dir/name via a temporary name, fsync, rename. */
int sn_write_atomic(const char *dest, const char *name, const void *buf, size_t n, k3_err *err);

/* `k3 setup --check` (check.c); found: whether DEST has a manifest. */
int sn_check(const k3_setup_opts *o, bool found, k3_err *err);

/* ---- disk budget of the raw-span cache (stream.c) ------------------------------------ */
/* The bookkeeping of .k3/experts under a byte budget, without the files (the caller holds
 * its lock and unlinks the victims): span i is EMPTY, WRITING (bytes reserved, not yet
 * renamed into place) or KEPT (its file is complete and on the LRU list).
 * Invariants: kept_bytes (KEPT and WRITING spans' sizes) <= budget after every reserve;
 * a victim is always KEPT with pins[i] == 0, so a span being fetched, written or read is
 * never evicted.
 * Why LRU and not the RAM cache's S3-FIFO (src/store/policy.h): setup may include only util
 * (tests/test_arch.c, docs/ARCHITECTURE.md), and once the engine takes its expert source
 * from the CLI nothing links the stream to the store. Moving policy.[ch] to util would let
 * this list become a k3_policy (insert, hit, victim with pins: the same three calls). */
enum { SN_DISK_EMPTY = 0, SN_DISK_WRITING = 1, SN_DISK_KEPT = 2 };
typedef struct sn_disk {
    int *prev, *next;         /* [n]: the LRU list of KEPT spans, head = most recently used */
    int head, tail;
    int *pins;                /* [n]: readers and fetchers of span i now */
    uint8_t *state;           /* [n]: SN_DISK_* */
    const uint64_t *bytes;    /* [n]: the size of span i's file (borrowed) */
    int n;
    uint64_t budget, kept_bytes, peak_bytes, evicted;
} sn_disk;

/* Errors: K3_ERR_GENERIC (out of memory). */
int sn_disk_init(sn_disk *d, int n, const uint64_t *bytes, uint64_t budget, k3_err *err);
void sn_disk_free(sn_disk *d);
/* Span i's complete file is on disk (found at open, or written by another process): KEPT,
 * the most recently used (open adds the files it finds oldest first). */
void sn_disk_found(sn_disk *d, int i);
/* Evicts until kept_bytes + extra <= budget (or nothing evictable is left); each victim is
 * reported to evict() (which unlinks its file) and becomes EMPTY. Returns 1 when it fits. */
int sn_disk_make_room(sn_disk *d, uint64_t extra, void (*evict)(void *user, int i), void *user);
/* Reserves span i's bytes for writing (evicting as needed): 1 reserved (WRITING), 0 not (it
 * is already KEPT or WRITING, or does not fit beside the pinned spans: do not keep it). */
int sn_disk_reserve(sn_disk *d, int i, void (*evict)(void *user, int i), void *user);
/* The write of a reserved span ended: ok → KEPT (the most recently used), else EMPTY. */
void sn_disk_commit(sn_disk *d, int i, bool ok);
/* A read found span i's file: it becomes the most recently used. */
void sn_disk_hit(sn_disk *d, int i);
/* The default budget's free-space margin for a file system of fs_bytes:
 * max(10% of it, min(20 GB, 25% of it)). */
uint64_t sn_disk_margin(uint64_t fs_bytes);

/* ---- progress ------------------------------------------------------------------------- */
typedef struct sn_progress {
    FILE *out;
    bool bar;
    const char *label;
    uint64_t total, done;
    double t0, last;
} sn_progress;

void sn_progress_begin(sn_progress *p, FILE *out, bool bar, const char *label, uint64_t total);
void sn_progress_add(void *p, uint64_t n);  /* k3_http_opts.on_bytes */
void sn_progress_end(sn_progress *p);
/* "1.23 GB" (decimal units, as the spec's sizes). Returns buf. */
char *sn_human(char *buf, size_t cap, uint64_t bytes);

#endif
