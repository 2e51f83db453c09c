/* bench_render.c — chat rendering time against the size of a hostile request (issue 20, D1):
 * 1k, 10k and 100k messages, tool-call argument keys, and tool calls answered by as many tool
 * results. Prints CPU seconds per render (best of 3) and the growth per 10x; linear is 10x.
 * Built by `make bench-render` (argument: the largest n, default 100000); figures in
 * BENCHMARKS.md. */
#include <cjson/cJSON.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../src/chat/render.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cJSON *body(int shape, int n) {
    cJSON *b = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(b, "messages");
    char key[32];
    if (shape == 0) {
        for (int i = 0; i < n; i++) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "user");
            cJSON_AddStringToObject(m, "content", "m");
            cJSON_AddItemToArray(msgs, m);
        }
        return b;
    }
    cJSON *a = cJSON_CreateObject(), *calls = cJSON_AddArrayToObject(a, "tool_calls");
    cJSON_AddStringToObject(a, "role", "assistant");
    cJSON_AddItemToArray(msgs, a);
    for (int c = 0; c < (shape == 1 ? 1 : n); c++) {
        cJSON *call = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(call, "function");
        snprintf(key, sizeof key, "c%d", c);
        cJSON_AddStringToObject(call, "id", key);
        cJSON_AddStringToObject(f, "name", "f");
        cJSON *args = cJSON_AddObjectToObject(f, "arguments");
        for (int k = 0; k < (shape == 1 ? n : 1); k++) {
            snprintf(key, sizeof key, "k%d", k);
            cJSON_AddNumberToObject(args, key, k);
        }
        cJSON_AddItemToArray(calls, call);
    }
    for (int t = 0; shape == 2 && t < n; t++) {
        cJSON *m = cJSON_CreateObject();
        snprintf(key, sizeof key, "c%d", n - 1 - t);
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "tool_call_id", key);
        cJSON_AddStringToObject(m, "content", "r");
        cJSON_AddItemToArray(msgs, m);
    }
    return b;
}

int main(int argc, char **argv) {
    static const char *const names[] = {"messages", "argument keys", "tool calls+results"};
    int max_n = argc > 1 ? atoi(argv[1]) : 100000;
    /* Keep freed memory in the process: otherwise each render pays the (virtualised, slow)
     * page faults of fresh memory again, which is the machine, not the renderer. */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    for (int shape = 0; shape < 3; shape++) {
        double prev = 0;
        for (int n = 1000; n <= max_n; n *= 10) {
            cJSON *b = body(shape, n);
            double best = 1e30;
            size_t segs_n = 0;
            for (int rep = 0; rep < 3; rep++) {
                k3_chat_request req;
                k3_err err = {0};
                k3_segments segs = {0};
                if (k3_chat_request_parse(b, &req, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
                double t0 = cpu_s();
                int rc = k3_chat_render(&req, 0, &segs, &err);
                double t = cpu_s() - t0;
                segs_n = segs.n;
                k3_segments_free(&segs);
                if (rc) return fprintf(stderr, "%s\n", err.msg), 1;
                if (t < best) best = t;
                if (best > 20) break; /* the quadratic renderer: one run is enough */
            }
            cJSON_Delete(b);
            printf("%-20s n=%-7d %9.4f s  %8zu segments", names[shape], n, best, segs_n);
            if (prev > 0) printf("  x%.1f", best / prev);
            printf("\n");
            fflush(stdout);
            prev = best;
        }
    }
    return 0;
}
