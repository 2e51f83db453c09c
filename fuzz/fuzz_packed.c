/* fuzz_packed.c — a packed-spine file's header and table through k3_pack_read_meta
 * (checksums, version, scheme, the lossless entries' table and escape count, canonical
 * layout) from a memfd. The first byte picks whether the harness repairs the table and
 * header checksums before the rest is written (odd: repair), so that mutations reach the
 * fields behind the checksums; a pack whose meta is accepted is also checked for each scheme
 * (k3_pack_check_scheme). */
#include <stdlib.h>
#include <sys/mman.h>
#include <xxhash.h>

#include "../src/format/packed.h"
#include "fuzz_files.h"

static void put64le(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Table checksum at 56 (over n·256 bytes after the header, as far as the input goes) and the
 * header checksum at 120, recomputed. */
static void repair(uint8_t *b, size_t size) {
    if (size < K3_PACK_HEADER_BYTES) return;
    uint64_t n = (uint64_t)b[16] | (uint64_t)b[17] << 8 | (uint64_t)b[18] << 16 |
                 (uint64_t)b[19] << 24;
    uint64_t tb = n * K3_PACK_ENTRY_BYTES, have = size - K3_PACK_HEADER_BYTES;
    put64le(b + 56, XXH3_64bits(b + K3_PACK_HEADER_BYTES, (size_t)(tb < have ? tb : have)));
    put64le(b + 120, XXH3_64bits(b, 120));
}

int k3_fuzz_packed(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t *b = malloc(size - 1 + 1);
    if (!b) return 0;
    memcpy(b, data + 1, size - 1);
    if (data[0] & 1) repair(b, size - 1);
    int fd = memfd_create("k3fuzz-pack", 0);
    size_t at = 0;
    while (fd >= 0 && at < size - 1) {
        ssize_t w = write(fd, b + at, size - 1 - at);
        if (w <= 0) break;
        at += (size_t)w;
    }
    k3_pack p;
    k3_err err = {0};
    if (fd >= 0 && at == size - 1 && !k3_pack_read_meta(fd, "fuzz.k3pack", &p, &err)) {
        k3_pack_check_scheme(&p, K3_PACK_SCHEME_INT8_ROW, &err);
        k3_pack_check_scheme(&p, K3_PACK_SCHEME_BF16LX, &err);
        k3_pack_clear(&p);
    }
    if (fd >= 0) close(fd);
    free(b);
    return 0;
}

K3_FUZZ_ENTRY(k3_fuzz_packed)
