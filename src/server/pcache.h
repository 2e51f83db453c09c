/* pcache.h — the prompt cache (`k3 serve --prompt-cache DIR`, issue 30): snapshots of a
 * session's whole state (KDA, conv windows, latent MLA rows, ids: a state file, k3.h
 * k3_session_save) at prefix boundaries, found again by the longest stored prefix of any
 * later prompt, from any conversation, client or process, and kept across restarts.
 *
 * Files: DIR/k3pc-<32 hex>.state, the hex being key(L) of the L ids the snapshot holds:
 *   chain: h_0 = XXH3-64(model fingerprint), h_{b+1} = XXH3-64(ids[64b, 64b+64), seed h_b)
 *   key(L) = XXH3-128(ids[64*(L/64), L), seed h_{L/64})
 * so a name depends only on the model and the ids: two processes (or hosts) writing the same
 * prefix write the same bytes under the same name; different prefixes never share one.
 *
 * Invariants:
 *  - A snapshot is used only when its file is a regular file (never a link or FIFO), its
 *    header is this model's and this build's, its length is the header's, its ids are exactly
 *    the request's first L ids and its checksum matches (k3_session_load_prefix). Anything
 *    else is skipped with one log line per file and the request is prefilled as without the
 *    cache (same reply, bit for bit: a restored state is the state the prefill would make).
 *  - Writes never touch an existing name: a new random temp file in DIR (O_CREAT | O_EXCL),
 *    fsync, rename (k3_session_save). A half-written file never has a cache name.
 *  - The files of this model stay within the byte budget: after each write the least recently
 *    used (file mtime, refreshed on each hit) are removed. A failed write (disk full) removes
 *    the oldest and tries once more, then gives up with a log line; it never fails a request.
 *    Files of other models in DIR are left alone (their own server bounds them).
 *  - The index is the folder itself, re-read before each lookup and write (a readdir and an
 *    88-byte header per new file): files another server wrote are found, removed ones dropped.
 *  - The RAM tier keeps the bytes of the last `ram` snapshots read from the folder (a hit from
 *    disk is kept; the least recently used goes), so the next conversation with the same
 *    prefix restores at memory speed; the caller counts them in the memory plan as `ram`
 *    sessions (a snapshot is a session's state plus its ids). A RAM copy is checked like a
 *    file (ids, checksum) each time it is used.
 *  - The worker thread is the only user of a k3_pcache (no lock). */
#ifndef K3_SRV_PCACHE_H
#define K3_SRV_PCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/k3.h"

/* Every N prompt ids a snapshot is taken inside a long prompt (besides message ends), or every
 * prompt pass when the passes are longer (k3_pcache_marks' `every`: a snapshot ends a pass, and
 * each pass reads again every expert its ids chose, ~all of K3's at 2048 ids). At K3
 * widths a snapshot at position p is ~465 MB + 55 KB * p, written in well under a second on
 * an NVMe, while 2048 prompt ids take minutes to prefill on a 128 GB machine: the write costs
 * < 1% of the prefill it saves and a restart loses at most 2048 ids of work. The inner ones
 * are dropped as the prompt goes on (k3_pcache_drop): a prompt keeps its message ends and
 * its last inner snapshot, not ~17 files (~25 GB at K3) for a 34k-token prompt. */
#define K3_PCACHE_EVERY 2048
/* Default disk budget (GB) when --prompt-cache-gb is not given, and snapshots kept in RAM
 * (--prompt-cache-ram; each counted by the memory plan as a session). */
#define K3_PCACHE_DEFAULT_GB 32.0
#define K3_PCACHE_DEFAULT_RAM 1

typedef struct k3_pcache k3_pcache;

/* What the cache did (added to by restore and save; the caller sums them into /metrics). */
typedef struct k3_pcache_stats {
    unsigned long long hits, tokens_restored, bytes_read; /* snapshots restored */
    unsigned long long ram_hits;                          /* ... of them from the RAM tier */
    unsigned long long saves, bytes_written, evicted;     /* snapshots written, files removed */
    unsigned long long skipped;                           /* files refused (logged) */
    double read_s, write_s; /* seconds restoring (folder scan included) and writing */
} k3_pcache_stats;

/* Opens the cache in folder dir (which must exist and be writable) for engine e's model,
 * with a budget of gb GB for this model's files (> 0) and `ram` snapshots in RAM (>= 0).
 * Errors: K3_ERR_USAGE (dir), K3_ERR_IO, K3_ERR_GENERIC (out of memory). */
int k3_pcache_open(const k3_engine *e, const char *dir, double gb, int ram, k3_pcache **out,
                   k3_err *err);
void k3_pcache_close(k3_pcache *pc);

/* Restores into sess the longest stored prefix of ids[0, n) that is longer than `more_than`
 * and at most `max` ids. Returns its length, or 0 (none: sess is then unchanged, or reset
 * when a file failed its checks while loading — the caller prefills from empty). */
size_t k3_pcache_restore(k3_pcache *pc, k3_session *sess, const int32_t *ids, size_t n,
                         size_t more_than, size_t max, k3_pcache_stats *st);

/* Stores sess's state (all the ids it holds) unless that prefix is stored already; failures
 * are logged, never returned. True when it wrote a new file. */
bool k3_pcache_save(k3_pcache *pc, const k3_session *sess, k3_pcache_stats *st);

/* Removes the file of prefix ids[0, L) (this model's), as evicted. A prompt's snapshot inside
 * a message (a K3_PCACHE_EVERY multiple) is dropped once the same prompt's next snapshot is
 * written: it only bounds the work a restart loses, and at K3 widths every such file is
 * ~0.5-2 GB (a 34k-token prompt would otherwise leave ~25 GB). */
void k3_pcache_drop(k3_pcache *pc, const int32_t *ids, size_t L, k3_pcache_stats *st);

/* The positions inside prompt ids[0, n) where snapshots are taken, ascending, each in
 * (from, n): after each end-of-message id `eom` (the system and tools block, each message)
 * and at each multiple of `every` ids (the prompt pass's length; K3_PCACHE_EVERY when that is
 * less); a position closer than K3_PCACHE_EVERY / 8 to the previous mark is skipped, but for
 * the first and the last message end (each costs a file and a shorter pass). Writes at most
 * cap to out; returns how many. */
size_t k3_pcache_marks(const int32_t *ids, size_t n, size_t from, int32_t eom, size_t every,
                       size_t *out, size_t cap);

#endif
