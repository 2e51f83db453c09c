/* metrics.c — GET /metrics's counters and their Prometheus text (metrics.h). */
#include <string.h>

#include "metrics.h"
#include "srv.h"

static const char *const endpoints[K3_METRICS_ENDPOINTS] = {
    "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
    "/v1/models", "/v1/models/ID", "/health", "/metrics", "/ui", "other"};

static const int codes[K3_METRICS_CODES - 1] = {200, 400, 401, 403, 404, 405, 408, 413,
                                                415, 421, 429, 499, 500, 503};

/* Powers of two up to the largest prefill chunk the server runs by default and beyond. */
static const int row_bounds[K3_METRICS_ROW_BUCKETS] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512,
                                                       1024};

void k3_metrics_request(k3_metrics *m, const char *endpoint, int status) {
    int e = K3_METRICS_ENDPOINTS - 1, c = K3_METRICS_CODES - 1;
    for (int i = 0; endpoint && i < K3_METRICS_ENDPOINTS - 1; i++)
        if (!strcmp(endpoint, endpoints[i])) e = i;
    for (int i = 0; i < K3_METRICS_CODES - 1; i++)
        if (status == codes[i]) c = i;
    m->requests[e][c]++;
}

void k3_metrics_pass(k3_metrics *m, int rows) {
    if (rows <= 0) return;
    int b = 0;
    while (b < K3_METRICS_ROW_BUCKETS && rows > row_bounds[b]) b++;
    m->pass_rows[b]++;
    m->passes++;
    m->rows += (unsigned long long)rows;
}

static void head(k3_sbuf *b, const char *name, const char *type, const char *help) {
    k3_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(k3_sbuf *b, const char *name, const char *help, unsigned long long v) {
    head(b, name, "counter", help);
    k3_sbuf_printf(b, "%s %llu\n", name, v);
}

static void gauge(k3_sbuf *b, const char *name, const char *help, double v) {
    head(b, name, "gauge", help);
    k3_sbuf_printf(b, "%s %.17g\n", name, v);
}

void k3_metrics_text(const k3_metrics *m, const k3_metrics_gauges *g, k3_sbuf *b) {
    head(b, "k3_requests_total", "counter", "HTTP requests answered, by endpoint and status");
    for (int e = 0; e < K3_METRICS_ENDPOINTS; e++)
        for (int c = 0; c < K3_METRICS_CODES; c++) {
            if (!m->requests[e][c]) continue;
            if (c < K3_METRICS_CODES - 1)
                k3_sbuf_printf(b, "k3_requests_total{endpoint=\"%s\",code=\"%d\"} %llu\n",
                               endpoints[e], codes[c], m->requests[e][c]);
            else
                k3_sbuf_printf(b, "k3_requests_total{endpoint=\"%s\",code=\"other\"} %llu\n",
                               endpoints[e], m->requests[e][c]);
        }
    counter(b, "k3_prompt_tokens_total", "prompt tokens prefilled (reused ones not counted)",
            m->prompt_tokens);
    counter(b, "k3_cached_prompt_tokens_total", "prompt tokens served from a kept state",
            m->cached_tokens);
    counter(b, "k3_completion_tokens_total", "tokens generated", m->completion_tokens);
    gauge(b, "k3_requests_active", "generations running", g->active);
    gauge(b, "k3_requests_queued", "generations waiting in the queue", g->queued);
    gauge(b, "k3_parallel_slots", "generations that may run at once (--parallel)", g->slots);
    gauge(b, "k3_queue_limit", "generations that may wait (--queue)", g->queue_limit);
    gauge(b, "k3_streams_waiting", "generations paused until their streaming client reads "
          "(its unread backlog is over the limit); the others go on", g->streams_waiting);
    gauge(b, "k3_stream_backlog_peak_bytes", "the most unread bytes a streamed reply has held "
          "since start (a client reading slower than the reply is generated)",
          (double)g->backlog_peak);

    head(b, "k3_pass_rows", "histogram", "token rows per forward pass");
    unsigned long long cum = 0;
    for (int i = 0; i < K3_METRICS_ROW_BUCKETS; i++) {
        cum += m->pass_rows[i];
        k3_sbuf_printf(b, "k3_pass_rows_bucket{le=\"%d\"} %llu\n", row_bounds[i], cum);
    }
    cum += m->pass_rows[K3_METRICS_ROW_BUCKETS];
    k3_sbuf_printf(b, "k3_pass_rows_bucket{le=\"+Inf\"} %llu\n", cum);
    k3_sbuf_printf(b, "k3_pass_rows_sum %llu\nk3_pass_rows_count %llu\n", m->rows, m->passes);

    counter(b, "k3_expert_requests_total", "routed experts asked of the expert store",
            m->expert_requests);
    counter(b, "k3_expert_hits_total", "expert requests found in the cache (prefetched ones "
            "included)", m->expert_hits);
    counter(b, "k3_expert_misses_total", "expert requests that waited for a read (on demand, or a "
            "prefetch still reading)",
            m->expert_misses);
    head(b, "k3_expert_hit_rate", "gauge", "expert hits / requests since load (NaN before any)");
    if (m->expert_requests)
        k3_sbuf_printf(b, "k3_expert_hit_rate %.6f\n",
                       (double)m->expert_hits / (double)m->expert_requests);
    else
        k3_sbuf_str(b, "k3_expert_hit_rate NaN\n");
    counter(b, "k3_expert_read_bytes_total", "bytes of routed experts read from storage",
            m->expert_bytes);
    counter(b, "k3_spine_read_bytes_total", "bytes of streamed spine layers read from storage",
            m->spine_bytes);
    head(b, "k3_expert_read_wait_seconds_total", "counter",
         "seconds passes waited for expert reads");
    k3_sbuf_printf(b, "k3_expert_read_wait_seconds_total %.6f\n", m->expert_wait_s);
    head(b, "k3_spine_read_wait_seconds_total", "counter",
         "seconds passes waited for streamed spine layers");
    k3_sbuf_printf(b, "k3_spine_read_wait_seconds_total %.6f\n", m->spine_wait_s);

    counter(b, "k3_state_cache_hits_total", "generations prefilled from a kept conversation "
            "state", m->state_hits);
    counter(b, "k3_state_cache_misses_total", "generations prefilled from an empty state",
            m->state_misses);
    counter(b, "k3_prompt_cache_hits_total", "prompts that resumed from a stored prefix "
            "snapshot (--prompt-cache)", m->pcache_hits);
    counter(b, "k3_prompt_cache_ram_hits_total", "of them, snapshots restored from the RAM "
            "tier (--prompt-cache-ram)", m->pcache_ram_hits);
    counter(b, "k3_prompt_cache_tokens_restored_total", "prompt tokens restored from snapshots",
            m->pcache_tokens);
    counter(b, "k3_prompt_cache_read_bytes_total", "bytes of snapshots read back",
            m->pcache_bytes_read);
    counter(b, "k3_prompt_cache_snapshots_total", "prefix snapshots written", m->pcache_saves);
    counter(b, "k3_prompt_cache_written_bytes_total", "bytes of snapshots written",
            m->pcache_bytes_written);
    counter(b, "k3_prompt_cache_evicted_total", "snapshot files removed to stay within "
            "--prompt-cache-gb", m->pcache_evicted);
    head(b, "k3_prompt_cache_read_seconds_total", "counter",
         "seconds spent finding and restoring snapshots");
    k3_sbuf_printf(b, "k3_prompt_cache_read_seconds_total %.6f\n", m->pcache_read_s);
    head(b, "k3_prompt_cache_write_seconds_total", "counter", "seconds spent writing snapshots");
    k3_sbuf_printf(b, "k3_prompt_cache_write_seconds_total %.6f\n", m->pcache_write_s);
    counter(b, "k3_prompt_cache_skipped_total", "snapshot files refused at load (damaged, "
            "another prefix); the prompt was prefilled instead", m->pcache_skipped);
    gauge(b, "k3_state_cache_entries", "conversation states kept", g->states_kept);
    gauge(b, "k3_state_cache_capacity", "conversation states the cache may keep (--state-cache)",
          g->states_cap);
}
