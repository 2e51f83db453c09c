/* status.c — the figures /health shows beside liveness: the memory plan, the last
 * generation's speed and the expert store's hit rate (the web page's status panel reads them).
 *
 * It also adds the job to /metrics' counters (metrics.h).
 * The worker owns the session, so it takes the counters after each job (k3_session_stats is
 * not safe from another thread) and copies them into s->status under s->mu; /health only
 * reads that copy and the engine's load-time lines, so it never waits for a generation.
 */
#include <string.h>

#include "srv.h"

void k3_srv_status_record(k3_server *s, const k3_job *j, const k3_session *session) {
    k3_run_stats st;
    k3_session_stats(session, &st);
    uint64_t bytes = st.bytes_read + st.spine_bytes_read;
    pthread_mutex_lock(&s->mu);
    k3_srv_status *o = &s->status;
    /* Tokens this job fed: the prompt beyond the reused part, and each completion token but
     * the last (never fed; worker.c). */
    int fed = j->n_prompt_used - j->n_cached + (j->n_completion > 0 ? j->n_completion - 1 : 0);
    o->gb_per_token = fed > 0 ? (double)(bytes - o->bytes_read_total) / 1e9 / fed : 0.0;
    o->bytes_read_total = bytes;
    o->expert_requests = st.expert_requests;
    o->expert_hits = st.hits + st.prefetch_hits;
    o->have_last = true;
    o->prompt_tokens = j->n_prompt_used;
    o->cached_tokens = j->n_cached;
    o->completion_tokens = j->n_completion;
    double t_decode = j->t_decode > 0 ? j->t_decode : j->t_end;
    o->prefill_s = t_decode > j->t_start ? t_decode - j->t_start : 0.0;
    o->decode_s = j->t_end > t_decode ? j->t_end - t_decode : 0.0;
    k3_metrics *m = &s->metrics;
    m->prompt_tokens += (unsigned long long)(j->n_prompt_used - j->n_cached);
    m->cached_tokens += (unsigned long long)j->n_cached;
    m->completion_tokens += (unsigned long long)j->n_completion;
    if (j->state_hit) m->state_hits++;
    else m->state_misses++;
    m->expert_requests = st.expert_requests;
    m->expert_hits = st.hits + st.prefetch_hits;
    m->expert_misses = st.misses + st.prefetch_late; /* waited for a read */
    m->expert_bytes = st.bytes_read;
    m->spine_bytes = st.spine_bytes_read;
    m->spine_wait_s = st.spine_wait_s;
    pthread_mutex_unlock(&s->mu);
}

static void json_line(k3_sbuf *b, const char *key, const char *line) {
    k3_sbuf_printf(b, ",\"%s\":\"", key);
    k3_sbuf_json_str(b, line ? line : "", line ? strlen(line) : 0);
    k3_sbuf_str(b, "\"");
}

void k3_srv_status_json(k3_server *s, k3_sbuf *b) {
    pthread_mutex_lock(&s->mu);
    k3_srv_status o = s->status;
    pthread_mutex_unlock(&s->mu);
    k3_sbuf_printf(b, ",\"context_tokens\":%d", s->ctx);
    char line[K3_DESCRIBE_CAP];
    k3_engine_describe(s->eng, K3_DESCRIBE_STORE, line, sizeof line);
    json_line(b, "memory_plan", line);
    k3_engine_describe(s->eng, K3_DESCRIBE_DEVICE, line, sizeof line);
    json_line(b, "device", line);
    if (o.expert_requests)
        k3_sbuf_printf(b, ",\"expert_hit_rate\":%.4f",
                       (double)o.expert_hits / (double)o.expert_requests);
    else
        k3_sbuf_str(b, ",\"expert_hit_rate\":null");
    k3_sbuf_printf(b, ",\"expert_requests\":%llu", (unsigned long long)o.expert_requests);
    if (!o.have_last) {
        k3_sbuf_str(b, ",\"last_generation\":null");
        return;
    }
    /* Decode speed counts the tokens after the first (the first comes out of prefill). */
    double tps = o.decode_s > 0 && o.completion_tokens > 1
                     ? (o.completion_tokens - 1) / o.decode_s : 0.0;
    k3_sbuf_printf(b, ",\"last_generation\":{\"prompt_tokens\":%d,\"cached_tokens\":%d,"
                   "\"completion_tokens\":%d,\"prefill_s\":%.3f,\"decode_s\":%.3f,"
                   "\"tokens_per_s\":%.2f,\"gb_per_token\":%.6f}",
                   o.prompt_tokens, o.cached_tokens, o.completion_tokens, o.prefill_s,
                   o.decode_s, tps, o.gb_per_token);
}
