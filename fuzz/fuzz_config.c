/* fuzz_config.c — config.json text through k3_config_parse (every field range-checked before
 * it is converted or multiplied). */
#include <string.h>

#include "../src/format/config.h"
#include "fuzz.h"

int k3_fuzz_config(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    k3_config cfg;
    k3_err err = {0};
    (void)k3_config_parse(text, "config.json", &cfg, &err);
    free(text);
    return 0;
}

K3_FUZZ_ENTRY(k3_fuzz_config)
