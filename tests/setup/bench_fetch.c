/* bench_fetch.c — on-demand expert fetch throughput of a streaming install (make bench-setup):
 * every expert not yet local is read with k3_stream_read from THREADS threads at once, as the
 * expert store's reader threads do. Prints one line: experts, bytes, seconds, GB/s, requests,
 * requests per expert.   usage: bench_fetch DEST THREADS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../../src/setup/setup.h"

typedef struct job {
    k3_stream *s;
    const k3_expert_span *spans;
    int n, next;
    uint64_t max_bytes, bytes;
    int failed;
    pthread_mutex_t mu;
} job;

static void *worker(void *arg) {
    job *j = arg;
    void *buf = malloc(j->max_bytes);
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int i = j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->n || !buf) break;
        const k3_expert_span *sp = &j->spans[i];
        k3_err err = {0};
        if (k3_stream_read(j->s, sp->layer, sp->expert, k3_stream_shard_name(j->s, sp->shard),
                           sp->offset, sp->nbytes, buf, &err)) {
            fprintf(stderr, "bench_fetch: %s\n", err.msg);
            j->failed = 1;
            break;
        }
        __atomic_add_fetch(&j->bytes, sp->nbytes, __ATOMIC_RELAXED);
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: bench_fetch DEST THREADS\n");
        return 2;
    }
    int threads = atoi(argv[2]);
    k3_stream *s = NULL;
    k3_err err = {0};
    k3_http_opts http = {.token = getenv("HF_TOKEN")};
    if (k3_stream_open(argv[1], &http, &s, &err) || !s) {
        fprintf(stderr, "bench_fetch: %s\n", s ? "" : err.msg[0] ? err.msg : "not a streaming install");
        return 1;
    }
    job j = {.s = s};
    j.spans = k3_stream_spans(s, &j.n);
    for (int i = 0; i < j.n; i++)
        if (j.spans[i].nbytes > j.max_bytes) j.max_bytes = j.spans[i].nbytes;
    pthread_mutex_init(&j.mu, NULL);
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, &j);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double dt = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    uint64_t fetched = k3_stream_fetched(s), req = k3_stream_requests(s);
    printf("%d %llu %.3f %.3f %llu %.3f\n", j.n, (unsigned long long)j.bytes, dt,
           (double)j.bytes / dt / 1e9, (unsigned long long)req,
           fetched ? (double)req / (double)fetched : 0.0);
    free(t);
    k3_stream_close(s);
    return j.failed;
}
