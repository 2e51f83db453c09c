/* fuzz_safetensors.c — a lone model.safetensors (header length, JSON header, offsets, dtypes,
 * shapes) through k3_checkpoint_open, which validates every entry before mapping. The first
 * byte picks a mode: odd = the rest is model.safetensors.index.json next to the k3-nano
 * shards (the index reader), even = the rest is model.safetensors. */
#include <errno.h>
#include <stdbool.h>

#include "../src/format/safetensors.h"
#include "fuzz_files.h"

static void link_nano_shards(const char *dir) {
    char from[1024], to[1024];
    for (int i = 1; i <= 11; i++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-000011.safetensors", i);
        if (!getcwd(from, sizeof from - 200)) return;
        size_t n = strlen(from);
        snprintf(from + n, sizeof from - n, "/tests/fixtures/k3-nano/%s", name);
        snprintf(to, sizeof to, "%s/%s", dir, name);
        if (symlink(from, to) && errno != EEXIST) return;
    }
}

int k3_fuzz_safetensors(const uint8_t *data, size_t size) {
    static char shard_dir[256], index_dir[256];
    if (!shard_dir[0]) {
        k3_fuzz_dir("st", shard_dir, sizeof shard_dir);
        k3_fuzz_dir("index", index_dir, sizeof index_dir);
        link_nano_shards(index_dir);
    }
    if (size < 1) return 0;
    bool index = data[0] & 1;
    const char *dir = index ? index_dir : shard_dir;
    if (k3_fuzz_write(dir, index ? "model.safetensors.index.json" : "model.safetensors",
                      data + 1, size - 1))
        return 0;
    k3_checkpoint *ck = NULL;
    k3_err err = {0};
    if (!k3_checkpoint_open(dir, &ck, &err)) k3_checkpoint_close(ck);
    return 0;
}

K3_FUZZ_ENTRY(k3_fuzz_safetensors)
