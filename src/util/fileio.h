/* fileio.h — small whole-file reads, path joining, and opening files in a folder others may
 * write to (a cache folder such as serve's --state-dir).
 *
 * Invariants (issue 32, D13/D14):
 *  - Reading opens with O_NOFOLLOW | O_NONBLOCK and checks fstat before reading: a FIFO, a
 *    device or a symbolic link at the name is refused at once, never waited on or followed.
 *  - Writing never opens an existing name: k3_create_temp makes a new file (O_CREAT | O_EXCL,
 *    which does not follow a symbolic link either) with a random name beside the target, to
 *    be renamed over it. */
#ifndef K3_FILEIO_H
#define K3_FILEIO_H

#include <stddef.h>
#include "err.h"

/* Reads the whole file into a malloc'd, NUL-terminated buffer (*len excludes the NUL).
 * max_bytes guards against reading something huge by mistake.
 * Errors: K3_ERR_IO naming the path (missing, unreadable, larger than max_bytes). */
int k3_read_file(const char *path, size_t max_bytes, char **out, size_t *len, k3_err *err);

/* snprintf(buf, cap, "%s/%s", dir, name); returns buf. Truncation is reported as "" . */
char *k3_path_join(char *buf, size_t cap, const char *dir, const char *name);

/* Opens path read-only when it is a regular file (not a symbolic link, FIFO, device or
 * folder); the descriptor is blocking and close-on-exec. Returns it, or -1 with K3_ERR_IO
 * naming path and what it is instead. */
int k3_open_regular(const char *path, k3_err *err);

/* Creates a new, empty file (mode 0600) beside `path`, named PATH.tmp-XXXXXX with six random
 * characters, writes its name to tmp (cap bytes) and returns a writable descriptor, or -1 with
 * K3_ERR_IO naming path. The caller renames tmp over path when done, or unlinks it. */
int k3_create_temp(const char *path, char *tmp, size_t cap, k3_err *err);

/* Fills out with 2 * n_bytes lowercase hex digits from the kernel's random source and a NUL
 * (out holds 2 * n_bytes + 1). Names made of it are unique across processes and hosts that
 * share a folder, unlike a pid. Errors: K3_ERR_IO (no random source). */
int k3_random_hex(char *out, size_t n_bytes, k3_err *err);

#endif
