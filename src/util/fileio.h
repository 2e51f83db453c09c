/* fileio.h — small whole-file reads and path joining. */
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

#endif
