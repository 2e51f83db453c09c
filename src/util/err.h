/* err.h — status codes and error messages that travel up to main.
 *
 * Invariants:
 *  - Library code never exits and never prints errors itself: a failing function fills a
 *    k3_err (code + one human-readable message naming the file/tensor and, when known, the
 *    fix) and returns the same code. Only main() decides to exit, with err.code as status.
 *  - K3_OK is 0; every other code is a distinct, documented process exit status.
 */
#ifndef K3_ERR_H
#define K3_ERR_H

#include <stddef.h>

enum k3_status {
    K3_OK = 0,
    K3_ERR_GENERIC = 1,   /* internal error, out of memory */
    K3_ERR_USAGE = 2,     /* bad command line */
    K3_ERR_IO = 3,        /* a file is missing, unreadable or a read failed */
    K3_ERR_CONFIG = 4,    /* config.json / tokenizer_config.json missing a field or malformed */
    K3_ERR_CHECKPOINT = 5,/* safetensors/index inconsistent: missing tensor, bad shape/dtype, truncated */
    K3_ERR_TOKENIZER = 6, /* tiktoken.model malformed, or text the tokenizer cannot encode */
    K3_ERR_INPUT = 7,     /* a token id out of range, prompt longer than the context */
    K3_ERR_PACK = 8,      /* packed spine file corrupt, truncated, incomplete, or from another model */
    K3_ERR_EXPERT_IO = 9, /* a routed expert could not be read from its shard mid-run */
    K3_ERR_NETWORK = 10,  /* k3 setup / streaming: a download failed after its retries, or the
                             server's answer was wrong (status, Content-Range, length, sha256) */
    K3_ERR_NO_SPACE = 11, /* k3 setup: not enough free disk; the message gives the bytes to free */
    K3_ERR_DEVICE = 12,   /* the GPU backend: no CUDA device, built without CUDA, a CUDA call
                             failed, or device memory too small for the plan */
    K3_ERR_DIST = 13,     /* an MPI run (make MPI=1): a rank failed, did not answer in time,
                             or MPI itself failed; the message names rank and host */
    K3_ERR_INTERRUPTED = 130, /* stopped by SIGINT (128 + 2, the shell convention) */
};

/* How many option fields one message may name (k3_fail_opts). */
#define K3_ERR_FIELDS 2

typedef struct k3_err {
    int code;
    char msg[1024];
    /* The option fields the message names ("spine_gb", a k3_engine_opts field), each with the
     * byte offset where its name stands in msg; an empty name ends the list. The edge shows the
     * flag that sets a field in its place (k3_opts_render): the library never writes a CLI flag,
     * and the edge never searches the text for look-alike words. */
    struct { char name[32]; size_t at; } field[K3_ERR_FIELDS];
} k3_err;

/* Fills err (if non-NULL) with code and a printf-style message (and no field); returns code.
 * Usage: return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", path, strerror(errno)); */
int k3_fail(k3_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The same for an error about one option field: msg is the field's name followed by the
 * formatted text, and err->field[0] the name at offset 0.
 * Usage: k3_fail_field(err, K3_ERR_USAGE, "spine_gb", " %g: expected ...", gb) gives
 * "spine_gb 2e+06: expected ...", which the CLI prints as "--spine-gb 2e+06: expected ...". */
int k3_fail_field(k3_err *err, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The same for a message whose advice names option fields anywhere in its text: fields is a
 * comma-separated list of at most K3_ERR_FIELDS names ("ctx" or "gpu_gb,ctx"), each of which
 * the formatted text holds as a word; the last such occurrence of each is recorded (so a path
 * formatted earlier in the text cannot be taken for it). A name the text lacks is not recorded.
 * Usage: k3_fail_opts(err, K3_ERR_INPUT, "ctx", "the prompt (%zu tokens) does not fit (raise
 * ctx)", n) prints as "... (raise --ctx)" from the CLI. */
int k3_fail_opts(k3_err *err, int code, const char *fields, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prefixes an existing message with more context ("loading model: ..."); returns err->code. */
int k3_err_prefix(k3_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
