#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

int k3_read_file(const char *path, size_t max_bytes, char **out, size_t *len, k3_err *err) {
    /* O_NONBLOCK: opening a FIFO must not hang before the regular-file check below. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return k3_fail(err, K3_ERR_IO, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size > max_bytes) {
        close(fd);
        return k3_fail(err, K3_ERR_IO, "%s: %lld bytes, more than the %zu expected", path,
                       (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return k3_fail(err, K3_ERR_GENERIC, "%s: out of memory", path);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
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

int k3_open_regular(const char *path, k3_err *err) {
    /* O_NONBLOCK: a FIFO must not hang the open; O_NOFOLLOW: a link is not followed */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP)
            return k3_fail(err, K3_ERR_IO, "%s: is a symbolic link; k3 reads this file only "
                           "under its own name", path), -1;
        return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", path, strerror(errno)), -1;
    }
    struct stat st;
    int fl = fcntl(fd, F_GETFL);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || fl < 0 ||
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        close(fd);
        return k3_fail(err, K3_ERR_IO, "%s: not a regular file (a FIFO, device or folder)",
                       path), -1;
    }
    return fd;
}

int k3_create_temp(const char *path, char *tmp, size_t cap, k3_err *err) {
    int n = snprintf(tmp, cap, "%s.tmp-XXXXXX", path);
    if (n < 0 || (size_t)n >= cap)
        return k3_fail(err, K3_ERR_IO, "%s: path too long", path), -1;
    /* mkostemp: O_CREAT | O_EXCL with a random suffix, retried while the name exists */
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) return k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", path, strerror(errno)), -1;
    return fd;
}

int k3_random_hex(char *out, size_t n_bytes, k3_err *err) {
    unsigned char b[64];
    if (n_bytes > sizeof b) n_bytes = sizeof b;
    size_t got = 0;
    while (got < n_bytes) {
        ssize_t r = getrandom(b + got, n_bytes - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return k3_fail(err, K3_ERR_IO, "no random source: %s", strerror(errno));
        got += (size_t)r;
    }
    for (size_t i = 0; i < n_bytes; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
    out[2 * n_bytes] = 0;
    return K3_OK;
}
