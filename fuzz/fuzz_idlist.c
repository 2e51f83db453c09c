/* fuzz_idlist.c — `--ids` / `--ids-file` text through k3_cli_parse_ids. Oracle: every id
 * returned is below the vocabulary. */
#include "../src/cli/idlist.h"
#include "fuzz.h"

int k3_fuzz_idlist(const uint8_t *data, size_t size) {
    int32_t *ids = NULL;
    size_t n = 0;
    k3_err err = {0};
    int bad = 0;
    if (!k3_cli_parse_ids((const char *)data, size, "fuzz", (int)(size & 1), 1000, &ids, &n,
                          &err))
        for (size_t i = 0; i < n; i++) bad |= ids[i] < 0 || ids[i] >= 1000;
    free(ids);
    return bad ? -1 : 0;
}

K3_FUZZ_ENTRY(k3_fuzz_idlist)
