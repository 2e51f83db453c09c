/* state_file.h — a session's timeline on disk (`--save-state` / `--load-state`), so a long
 * prompt is processed once and continued later. Reached through k3_session_save/load.
 *
 * Layout (little-endian hosts only; every integer native = little-endian):
 *   header, 88 bytes (struct k3_state_file_header below): magic "K3STATE1", version 2,
 *     fingerprint of the model, pos, layer counts and per-layer sizes, payload size
 *   payload: int32 tokens[pos]; f32 KDA state [n_kda][heads][d][d]; f32 conv windows
 *     [n_kda][3][P][conv-1]; f32 MLA cache, per MLA layer the first pos rows
 *     [pos][kv_floats] (latent form, state.h: normed c_kv ++ k_pe). Version 1 held the
 *     expanded form; it is refused with a message saying so (no conversion exists).
 *   uint64 XXH3-64 of every byte before it.
 *
 * Invariants:
 *  - The fingerprint (XXH3-128) covers config.json's bytes, every tensor's name, dtype and
 *    shape, the first and last 4 KiB of every non-expert tensor, and the spine mode, so a
 *    state never loads into another model (or the same model with another spine). Routed
 *    expert bytes are not read (the metadata still covers their names and shapes).
 *  - Load checks magic, version, fingerprint, sizes and the file length before it touches
 *    the session; a checksum mismatch (found while reading) resets the session.
 *  - Save writes a new file of a random name beside PATH (O_CREAT | O_EXCL: never an
 *    existing file, never through a symbolic link) and renames it over PATH, so PATH is never
 *    half-written and a link planted at a guessable name redirects nothing (issue 32, D14).
 *  - Load opens with O_NOFOLLOW | O_NONBLOCK and reads only a regular file: a FIFO or a link
 *    at PATH is refused at once, never waited on (D13).
 *  - A cache's load (k3_state_want: serve's --state-dir) also checks that the file holds
 *    exactly the ids it was written for and this build's engine stamp, before the session is
 *    touched: a file another process wrote under the same name is refused, never continued
 *    from (D12).
 */
#ifndef K3_STATE_FILE_H
#define K3_STATE_FILE_H

#include <stdint.h>
#include "state.h"

#define K3_STATE_MAGIC "K3STATE1"
#define K3_STATE_VERSION 2

typedef struct k3_state_file_header {
    char magic[8];
    uint32_t version, header_bytes;
    uint8_t fingerprint[16];
    int32_t pos;
    uint32_t n_kda, n_mla, spine_int8;
    uint64_t kda_S_floats, kda_conv_floats, kv_floats; /* per layer (per position for kv) */
    uint64_t payload_bytes;
    uint64_t engine; /* k3_state_engine_stamp() of the build that wrote it (0 before 0.1.0's
                        issue 32; checked only for a cache's files: k3_state_want) */
} k3_state_file_header;

/* What a cache expects of the file it wrote: exactly these n ids (the prefix it restores)
 * and this build's engine stamp. */
typedef struct k3_state_want {
    const int32_t *tokens;
    int n;
} k3_state_want;

/* XXH3-64 of "k3-engine " K3_VERSION: states written by another build may continue
 * differently (kernels change between versions), so a cache uses only its own build's. */
uint64_t k3_state_engine_stamp(void);

/* The model fingerprint described above. spine_int8: 1 when the spine is the int8 pack.
 * Errors: K3_ERR_IO (config.json unreadable), K3_ERR_GENERIC. */
int k3_model_fingerprint(const k3_checkpoint *ck, int spine_int8, uint8_t out[16], k3_err *err);

/* Writes s (positions [0, s->pos), tokens[0, s->pos)) to path. Errors: K3_ERR_IO. */
int k3_state_file_save(const k3_state *s, const k3_model *m, const k3_checkpoint *ck,
                       int spine_int8, const int32_t *tokens, const char *path, k3_err *err);

/* Replaces s and tokens[0, pos) with the file's. want: NULL (any prefix: --load-state), or the
 * prefix the file must hold (K3_ERR_INPUT otherwise, s unchanged). Errors: see
 * k3_session_load (k3.h). */
int k3_state_file_load(k3_state *s, const k3_model *m, const k3_checkpoint *ck, int spine_int8,
                       int32_t *tokens, const char *path, const k3_state_want *want,
                       k3_err *err);

/* k3_state_file_load from the n bytes of a state file in memory (buf, named `name` in
 * messages): a cache's copy in RAM. Errors: those of k3_state_file_load. */
int k3_state_file_load_mem(k3_state *s, const k3_model *m, const k3_checkpoint *ck,
                           int spine_int8, int32_t *tokens, const void *buf, size_t n,
                           const char *name, const k3_state_want *want, k3_err *err);

/* A state file's header alone, for a cache's index: *pos and the file's *bytes when path is a
 * regular file (k3_open_regular) holding a version-2 header of this fingerprint (the model's,
 * k3_model_fingerprint) and this build's engine stamp, and exactly the length the header
 * announces. The payload and checksum are not read (k3_state_file_load checks them).
 * Errors: K3_ERR_IO (unreadable, not a state file, truncated), K3_ERR_INPUT (another model,
 * spine mode or build). */
int k3_state_file_peek(const char *path, const uint8_t fingerprint[16], int *pos,
                       uint64_t *bytes, k3_err *err);

#endif
