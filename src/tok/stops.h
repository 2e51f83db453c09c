/* stops.h — the ids that end a generation (spec §12.4): <|end_of_msg|> (config
 * eos_token_id), [EOS] and [EOT]. A tokenizer fact, used by the sampling loop (src/engine,
 * src/cli, src/server) and by the reply parser (src/chat).
 *
 * Invariant: at most 4 distinct ids; an id that is never sampled (< 0) is not kept. */
#ifndef K3_STOPS_H
#define K3_STOPS_H

#include <stdbool.h>
#include <stdint.h>

#include "tokenizer.h"

typedef struct k3_stops {
    int32_t ids[4];
    int n;
} k3_stops;

/* Fills s from the tokenizer's specials and the config's eos_token_id (spec §12.4). */
void k3_stops_init(k3_stops *s, const k3_tokenizer *t, int32_t eos_token_id);
bool k3_stops_has(const k3_stops *s, int32_t id);

#endif
