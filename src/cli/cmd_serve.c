/* cmd_serve.c — `k3 serve`: load the model, start the OpenAI-compatible server, print where
 * it listens, and run until SIGINT/SIGTERM. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/k3.h"
#include "../server/server.h"
#include "cli.h"
#include "device_flags.h"
#include "spine_flags.h"

static volatile sig_atomic_t stop_requested; /* CLI-level signal flag */

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void serve_usage(FILE *f) {
    fprintf(f,
        "usage: k3 serve [MODEL_DIR] [--host 127.0.0.1] [--port 8000] [options]\n"
        "\n"
        "Serves the model over an OpenAI-compatible HTTP API until Ctrl-C (SIGINT) or SIGTERM:\n"
        "  GET  /v1/models, /v1/models/ID   the one served model\n"
        "  POST /v1/chat/completions        chat (K3 chat format; thinking as reasoning_content)\n"
        "  POST /v1/completions             raw text completion of a prompt\n"
        "  GET  /health                     liveness and queue state (no key needed)\n"
        "Each path also works without the /v1 prefix. Streaming (\"stream\": true) uses\n"
        "Server-Sent Events ending with data: [DONE]. One generation runs at a time.\n"
        "Without MODEL_DIR the bundled fixture model is used.\n"
        "\n"
        "  --host ADDR          address to listen on (default 127.0.0.1: this machine only;\n"
        "                       0.0.0.0 or :: exposes the server to the network)\n"
        "  --port N             TCP port (default 8000; 0 picks a free one, printed at start)\n"
        "  --api-key KEY        require \"Authorization: Bearer KEY\" on /v1 requests\n"
        "                       (default: $K3_API_KEY; no key = no auth)\n"
        "  --max-tokens N       most completion tokens one request may ask for or get; larger\n"
        "                       max_tokens is a 400 (default: $K3_SERVER_MAX_TOKENS, else the\n"
        "                       context)\n"
        "  --queue N            let N requests wait in a FIFO while one generates; further\n"
        "                       ones get 429 (default 0: 429 + Retry-After whenever busy)\n"
        "  --ctx N              context capacity in tokens (default min(4096, model max))\n"
        "  --max-body BYTES     largest request body (default 8388608); larger is a 413\n"
        "  --model-id NAME      model name in /v1/models (default: MODEL_DIR's folder name)\n"
        "  --threads N          compute threads (default: OMP_NUM_THREADS, else physical cores)\n"
        "  --spine MODE         auto (default), bf16 (exact) or int8 (NOT exact), as in k3 run\n"
        "  --pack-dir DIR       folder of the packed spine (default MODEL_DIR)\n"
        "%s"
        "  --no-reuse           prefill every prompt from an empty state instead of reusing\n"
        "                       the kept conversation (same prompts, same output; slower)\n"
        "  --spec N             speculative decoding with up to N drafted ids per pass, as in\n"
        "                       k3 run (greedy output unchanged; default 0 = off)\n"
        "  -q, --quiet          no load line and no per-request log on stderr\n"
        "  -h, --help           this help\n", k3_cli_spine_gb_help);
    fprintf(f, "\n%s", k3_cli_device_env_help);
}

typedef struct serve_args {
    const char *model_dir, *pack_dir;
    k3_server_opts so;
    int threads, spine;
    bool quiet;
    k3_cli_spine_budget spine_gb; /* --spine-gb (spine_flags.h) */
} serve_args;

static int parse_num(const char *s, const char *what, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "k3 serve: %s needs an integer in [%lld, %lld], got '%s'\n", what, lo,
                hi, s);
        return K3_ERR_USAGE;
    }
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, serve_args *a) {
    *a = (serve_args){.so = {.port = 8000, .log_requests = 1}, .spine = K3_SPINE_AUTO};
    long long v = 0;
    const char *env = getenv("K3_API_KEY");
    if (env && env[0]) a->so.api_key = env;
    env = getenv("K3_SERVER_MAX_TOKENS");
    if (env && env[0]) {
        if (parse_num(env, "K3_SERVER_MAX_TOKENS", 1, 1 << 30, &v)) return K3_ERR_USAGE;
        a->so.max_tokens = (int)v;
    }
    /* Tests only, deliberately not in --help: replies replaced by a script (server.h). */
    env = getenv("K3_TEST_SCRIPTED_REPLY");
    if (env && env[0]) a->so.scripted_reply = env;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = k3_cli_spine_gb_flag("serve", argc, argv, &i, &a->spine_gb);
        if (rc == 1) continue;
        if (rc) return rc;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) { serve_usage(stdout); return -1; }
        else if (!strcmp(o, "-q") || !strcmp(o, "--quiet")) a->quiet = true;
        else if (!strcmp(o, "--no-reuse")) a->so.no_reuse = 1;
        else if (!strcmp(o, "--host") && val) a->so.host = argv[++i];
        else if (!strcmp(o, "--api-key") && val) a->so.api_key = argv[++i];
        else if (!strcmp(o, "--model-id") && val) a->so.model_id = argv[++i];
        else if (!strcmp(o, "--pack-dir") && val) a->pack_dir = argv[++i];
        else if (!strcmp(o, "--spine") && val) {
            const char *m = argv[++i];
            if (!strcmp(m, "auto")) a->spine = K3_SPINE_AUTO;
            else if (!strcmp(m, "bf16")) a->spine = K3_SPINE_BF16;
            else if (!strcmp(m, "int8")) a->spine = K3_SPINE_INT8;
            else {
                fprintf(stderr, "k3 serve: --spine needs auto, bf16 or int8, got '%s'\n", m);
                return K3_ERR_USAGE;
            }
        }
        else if (!strcmp(o, "--port") && val) {
            if (!(rc = parse_num(argv[++i], o, 0, 65535, &v))) a->so.port = (int)v;
        } else if (!strcmp(o, "--max-tokens") && val) {
            if (!(rc = parse_num(argv[++i], o, 1, 1 << 30, &v))) a->so.max_tokens = (int)v;
        } else if (!strcmp(o, "--spec") && val) {
            if (!(rc = parse_num(argv[++i], o, 0, K3_MAX_CHUNK - 1, &v))) a->so.spec = (int)v;
        } else if (!strcmp(o, "--queue") && val) {
            if (!(rc = parse_num(argv[++i], o, 0, 1024, &v))) a->so.queue = (int)v;
        } else if (!strcmp(o, "--ctx") && val) {
            if (!(rc = parse_num(argv[++i], o, 1, 1 << 30, &v))) a->so.ctx = (int)v;
        } else if (!strcmp(o, "--max-body") && val) {
            if (!(rc = parse_num(argv[++i], o, 64, 1LL << 34, &v))) a->so.max_body_bytes = (size_t)v;
        } else if (!strcmp(o, "--threads") && val) {
            if (!(rc = parse_num(argv[++i], o, 1, 4096, &v))) a->threads = (int)v;
        } else if (o[0] != '-' && !a->model_dir) a->model_dir = o;
        else {
            fprintf(stderr, "k3 serve: unknown option or missing value: '%s' (see k3 serve "
                    "--help)\n", o);
            return K3_ERR_USAGE;
        }
        if (rc) return rc;
    }
    if (!a->model_dir) a->model_dir = k3_default_model_dir();
    a->so.log_requests = !a->quiet;
    return 0;
}

static int serve(const serve_args *a, k3_err *err) {
    k3_engine *e = NULL;
    k3_server *srv = NULL;
    k3_engine_opts eo = {.threads = a->threads, .verbose = !a->quiet, .spine = a->spine,
                         .pack_dir = a->pack_dir};
    k3_cli_spine_gb_apply(&a->spine_gb, &eo);
    int rc = k3_engine_load(a->model_dir, &eo, &e, err);
    if (!rc) rc = k3_server_start(e, a->model_dir, &a->so, &srv, err);
    if (rc) {
        k3_engine_free(e);
        return rc;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    char policy[512];
    k3_server_describe_policy(srv, policy, sizeof policy);
    /* Always printed (also with -q): tests and scripts read the URL from this line. */
    printf("k3 serve: listening on %s/v1 (model \"%s\" from %s)\n", k3_server_url(srv),
           k3_server_model_id(srv), a->model_dir);
    printf("k3 serve: %s\n", policy);
    if (k3_engine_spine_int8(e)) printf("k3 serve: %s\n", k3_engine_spine_line(e));
    fflush(stdout);
    while (!stop_requested) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!a->quiet) fprintf(stderr, "k3 serve: stopping\n");
    k3_server_stop(srv);
    k3_engine_free(e);
    return K3_OK;
}

int k3_cmd_serve(int argc, char **argv) {
    serve_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    k3_err err = {0};
    rc = serve(&a, &err);
    if (rc) fprintf(stderr, "k3: %s\n", err.msg);
    return rc;
}
