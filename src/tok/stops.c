/* stops.c — the stop ids of a generation (stops.h). */
#include "stops.h"

static void add_stop(k3_stops *s, int32_t id) {
    if (id < 0 || k3_stops_has(s, id) || s->n == 4) return;
    s->ids[s->n++] = id;
}

void k3_stops_init(k3_stops *s, const k3_tokenizer *t, int32_t eos_token_id) {
    s->n = 0;
    add_stop(s, eos_token_id);
    add_stop(s, k3_tokenizer_special_id(t, "<|end_of_msg|>"));
    add_stop(s, k3_tokenizer_special_id(t, "[EOS]"));
    add_stop(s, k3_tokenizer_special_id(t, "[EOT]"));
}

bool k3_stops_has(const k3_stops *s, int32_t id) {
    for (int i = 0; i < s->n; i++)
        if (s->ids[i] == id) return true;
    return false;
}
