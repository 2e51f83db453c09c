/* progress.c — bytes, rate and ETA: a redrawn bar on a terminal, plain lines otherwise. */
#include "setup_internal.h"
#include "../util/clock.h"

#include <time.h>

#define BAR_REDRAW_S 0.2
#define LINE_EVERY_S 5.0

char *sn_human(char *buf, size_t cap, uint64_t b) {
    if (b >= 1000000000000ull) snprintf(buf, cap, "%.2f TB", (double)b / 1e12);
    else if (b >= 1000000000ull) snprintf(buf, cap, "%.2f GB", (double)b / 1e9);
    else if (b >= 1000000ull) snprintf(buf, cap, "%.1f MB", (double)b / 1e6);
    else if (b >= 1000ull) snprintf(buf, cap, "%.1f kB", (double)b / 1e3);
    else snprintf(buf, cap, "%llu B", (unsigned long long)b);
    return buf;
}

static void eta(char *buf, size_t cap, double s) {
    if (s < 0 || s > 1e7) snprintf(buf, cap, "--:--");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else snprintf(buf, cap, "%d:%02d", (int)(s / 60), (int)s % 60);
}

static void draw(sn_progress *p, double now, bool final) {
    char d[32], t[32], r[32], e[32];
    double el = now - p->t0, rate = el > 0 ? (double)p->done / el : 0;
    sn_human(d, sizeof d, p->done);
    sn_human(t, sizeof t, p->total);
    sn_human(r, sizeof r, (uint64_t)rate);
    eta(e, sizeof e, rate > 0 ? (double)(p->total - (p->done < p->total ? p->done : p->total)) / rate
                              : -1);
    int pct = p->total ? (int)(100.0 * (double)p->done / (double)p->total) : 100;
    if (pct > 100) pct = 100;
    if (p->bar) {
        char bar[31];
        int fill = pct * 30 / 100;
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(p->out, "\r%s [%s] %3d%% %s / %s  %s/s  ETA %s\033[K%s", p->label, bar, pct, d, t,
                r, final ? "0:00" : e, final ? "\n" : "");
    } else {
        fprintf(p->out, "%s: %s of %s (%d%%), %s/s%s%s\n", p->label, d, t, pct, r,
                final ? "" : ", ETA ", final ? "" : e);
    }
    fflush(p->out);
}

void sn_progress_begin(sn_progress *p, FILE *out, bool bar, const char *label, uint64_t total) {
    *p = (sn_progress){.out = out, .bar = bar, .label = label, .total = total};
    p->t0 = p->last = k3_now_s();
}

void sn_progress_add(void *user, uint64_t n) {
    sn_progress *p = user;
    if (!p) return;
    p->done += n;
    if (!p->out) return; /* not begun: count only (metadata before the plan) */
    double now = k3_now_s();
    if (now - p->last >= (p->bar ? BAR_REDRAW_S : LINE_EVERY_S)) {
        p->last = now;
        draw(p, now, false);
    }
}

void sn_progress_end(sn_progress *p) {
    if (p->total || p->done) draw(p, k3_now_s(), true);
}
