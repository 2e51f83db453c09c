#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int k3_read_file(const char *path, size_t max_bytes, char **out, size_t *len, k3_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return k3_fail(err, K3_ERR_IO, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size > max_bytes) {
        fclose(f);
        return k3_fail(err, K3_ERR_IO, "%s: %lld bytes, more than the %zu expected", path,
                       (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return k3_fail(err, K3_ERR_GENERIC, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, n, f);
    int rerr = ferror(f);
    fclose(f);
    if (got != n || rerr) {
        free(buf);
        return k3_fail(err, K3_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return K3_OK;
}

char *k3_path_join(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) buf[0] = 0;
    return buf;
}
