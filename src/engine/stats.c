/* stats.c — the end-of-run summary and the per-token profile line (k3.h, issue 3). */
#include <stdio.h>
#include <string.h>

#include "k3.h"

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

/* Percent of read time not waited for: 1 - waited / read, clamped to [0, 100] (a pass may
 * also wait for a read that another pass's compute did not cover); 0 when nothing was read. */
static double hidden(double waited, double read) {
    if (!(read > 0)) return 0.0;
    double h = 100.0 * (1.0 - waited / read);
    return h < 0 ? 0.0 : h > 100 ? 100.0 : h;
}

static void recall_text(double r, char *buf, size_t cap) {
    if (r < 0) snprintf(buf, cap, "n/a");
    else snprintf(buf, cap, "%.1f%%", 100 * r);
}

void k3_run_stats_summary(const k3_run_stats *st, char *buf, size_t cap) {
    const k3_phase_times *t = &st->time;
    char rp[16], rl[16];
    recall_text(st->recall_prev, rp, sizeof rp);
    recall_text(st->recall_lookahead, rl, sizeof rl);
    double gb = (double)st->bytes_read / 1e9;
    snprintf(buf, cap, "time: total %.3f s / attn %.3f / moe %.3f (eload %.3f) / head %.3f "
             "over %ld steps; experts: %llu requests, hit rate %.1f%% (%.1f%% with prefetch "
             "hits), %llu reads, %.3f GB streamed (%.2f GB/s over the run); prefetch: %llu reads, %llu "
             "unused, recall prev %s, lookahead %s; peak RSS %.2f GB (plan %.2f GB)",
             t->total_s, t->attn_s, t->moe_s, t->eload_s, t->head_s, t->tokens,
             (unsigned long long)st->expert_requests, pct(st->hits, st->expert_requests),
             pct(st->hits + st->prefetch_hits, st->expert_requests),
             (unsigned long long)st->reads, gb, t->total_s > 0 ? gb / t->total_s : 0.0,
             (unsigned long long)st->prefetch_reads, (unsigned long long)st->prefetch_wasted,
             rp, rl, (double)st->peak_rss_bytes / 1e9, (double)st->plan_bytes / 1e9);
    size_t len = strlen(buf);
    if (st->prefetch_skipped && len < cap)
        snprintf(buf + len, cap - len, "; %llu predictions not read (a predictor paused: it "
                 "wasted more reads than it hid; the spine's reader busy %.0f%% of the time)",
                 (unsigned long long)st->prefetch_skipped, 100 * st->spine_busy);
    len = strlen(buf);
    double sgb = (double)st->spine_bytes_read / 1e9;
    if (st->spine_streams && len < cap)
        snprintf(buf + len, cap - len, "; spine budget: %.3f GB streamed (%.2f GB/s while "
                 "reading), passes waited %.3f s", sgb,
                 st->spine_read_s > 0 ? sgb / st->spine_read_s : 0.0, st->spine_wait_s);
    len = strlen(buf);
    double er = st->read_busy_s, ew = st->time.eload_s;
    double sr = st->spine_streams ? st->spine_read_s : 0, sw = st->spine_streams ? st->spine_wait_s : 0;
    if (er + sr > 0 && len < cap)
        snprintf(buf + len, cap - len, "; reads hidden behind compute: %.0f%% (experts %.0f%%: "
                 "waited %.3f of %.3f s reading; spine %.0f%%: waited %.3f of %.3f s)",
                 hidden(ew + sw, er + sr), hidden(ew, er), ew, er, hidden(sw, sr), sw, sr);
}

void k3_run_stats_profile(const k3_run_stats *st, char *buf, size_t cap) {
    const k3_phase_times *t = &st->last;
    char what[96]; /* a batched pass is one measurement: its tokens, not one of them */
    if (t->tokens > 1)
        snprintf(what, sizeof what, "tokens %ld-%ld (one pass of %ld, %.2f ms per token)",
                 st->time.tokens - t->tokens + 1, st->time.tokens, t->tokens,
                 1e3 * t->total_s / (double)t->tokens);
    else
        snprintf(what, sizeof what, "token %ld", st->time.tokens);
    snprintf(buf, cap, "profile: %s: total %.2f ms: attn %.2f, router %.2f, expert wait "
             "%.2f, expert compute %.2f, other moe %.2f, head %.2f, rest %.2f",
             what, 1e3 * t->total_s, 1e3 * t->attn_s, 1e3 * t->router_s,
             1e3 * t->eload_s, 1e3 * t->expert_s,
             1e3 * (t->moe_s - t->router_s - t->eload_s - t->expert_s), 1e3 * t->head_s,
             1e3 * (t->total_s - t->attn_s - t->moe_s - t->head_s));
}
