/* fuzz_files.h — writing a fuzz input where a file-based reader expects it. */
#ifndef K3_FUZZ_FILES_H
#define K3_FUZZ_FILES_H

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

/* dir (created once per process: <tmp>/k3fuzz-<tag>-<pid>) into out. */
static inline void k3_fuzz_dir(const char *tag, char *out, size_t cap) {
    snprintf(out, cap, "%s/k3fuzz-%s-%d", k3_fuzz_tmpdir(), tag, (int)getpid());
    mkdir(out, 0700);
}

/* Writes data to dir/name; 0 on success. */
static inline int k3_fuzz_write(const char *dir, const char *name, const uint8_t *data,
                                size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    size_t at = 0;
    while (at < size) {
        ssize_t w = write(fd, data + at, size - at);
        if (w <= 0) break;
        at += (size_t)w;
    }
    close(fd);
    return at == size ? 0 : -1;
}

#endif
