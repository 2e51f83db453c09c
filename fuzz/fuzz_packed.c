/* fuzz_packed.c — a packed-spine file's header and table through k3_pack_read_meta
 * (checksums, version, canonical layout) from a memfd. */
#include <sys/mman.h>

#include "../src/format/packed.h"
#include "fuzz_files.h"

int k3_fuzz_packed(const uint8_t *data, size_t size) {
    int fd = memfd_create("k3fuzz-pack", 0);
    if (fd < 0) return 0;
    size_t at = 0;
    while (at < size) {
        ssize_t w = write(fd, data + at, size - at);
        if (w <= 0) break;
        at += (size_t)w;
    }
    k3_pack p;
    k3_err err = {0};
    if (at == size && !k3_pack_read_meta(fd, "fuzz.k3pack", &p, &err)) k3_pack_clear(&p);
    close(fd);
    return 0;
}

K3_FUZZ_ENTRY(k3_fuzz_packed)
