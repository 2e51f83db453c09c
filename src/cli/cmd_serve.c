/* cmd_serve.c — `k3 serve`: load the model, start the OpenAI-compatible server, print where
 * it listens, and run until SIGINT/SIGTERM. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/k3.h"
#include "../server/server.h"
#include "../util/parse.h"
#include "cli.h"
#include "load.h"
#include "interrupt.h"
#include "opts.h"

typedef struct serve_args {
    const char *model_dir;
    k3_server_opts so;
    k3_engine_opts eo;
    k3_cli_chat_opts co; /* --chunk, --spec */
    k3_cli_common cc;
    const char *state_dir; /* --state-dir: the old name of --prompt-cache */
    int state_files;       /* --state-files: gone (refused with a message) */
} serve_args;

static const k3_opt_choice efforts[] = {{"low", 0}, {"high", 0}, {"max", 0}, {NULL, 0}};

#define SRV(f) K3_OPT_CMD(serve_args, so.f), .field = #f
static const k3_opt serve_rows[] = {
    {.flag = "--host", SRV(host), .type = K3_OPT_STR, .meta = "ADDR", .def = "127.0.0.1",
     .help = "address to listen on (this machine only by default; 0.0.0.0 or :: exposes\n"
             "the server to the network)"},
    {.flag = "--port", SRV(port), .type = K3_OPT_INT, .lo = 0, .hi = 65535, .def = "8000",
     .meta = "N", .help = "TCP port (0 picks a free one, printed at start)"},
    {.flag = "--api-key", .env = "K3_API_KEY", SRV(api_key), .type = K3_OPT_STR,
     .flags = K3_OPTF_NONEMPTY, .meta = "KEY",
     .help = "require \"Authorization: Bearer KEY\" on /v1 requests (default: no auth;\n"
             "an empty KEY is an error)"},
    {.flag = "--max-tokens", .env = "K3_SERVER_MAX_TOKENS", SRV(max_tokens), .type = K3_OPT_INT,
     .lo = 1, .hi = 1 << 30, .meta = "N",
     .help = "most completion tokens one request gets; a larger max_tokens is cut to N\n"
             "(finish_reason length) (default: the context)"},
    {.flag = "--queue", SRV(queue), .type = K3_OPT_INT, .lo = 0, .hi = 1024, .def = "64",
     .meta = "N", .help = "let N requests wait in a FIFO while --parallel are generating; further\n"
                          "ones get 429 (0: 429 + Retry-After whenever busy; agents send\n"
                          "side requests, titles and retries, that should wait instead)"},
    {.flag = "--max-body", SRV(max_body_bytes), .type = K3_OPT_SIZE, .lo = 64, .hi = 1LL << 34,
     .def = "8388608", .meta = "BYTES", .help = "largest request body; larger is a 413"},
    {.flag = "--model-id", SRV(model_id), .type = K3_OPT_STR, .meta = "NAME",
     .help = "model name in /v1/models (default: MODEL_DIR's folder name)"},
    {.flag = "--parallel", SRV(parallel), .type = K3_OPT_INT, .lo = 1, .hi = 64, .def = "1",
     .meta = "N",
     .help = "run up to N generations at once, their tokens in shared passes (each reply\n"
             "identical to running alone); N sessions, counted by the memory plan;\n"
             "--queue waits beyond N (1: one at a time)"},
    {.flag = "--state-cache", SRV(state_cache), .type = K3_OPT_INT, .lo = 1, .hi = 256,
     .def = "1", .meta = "K",
     .help = "keep the states of the last K conversations (one session each, counted by\n"
             "the memory plan): a request extending any of them prefills only what is new\n"
             "(at least --parallel are kept)"},
    {.flag = "--prompt-cache", SRV(prompt_cache), .type = K3_OPT_STR,
     .flags = K3_OPTF_NONEMPTY, .meta = "DIR",
     .help = "keep snapshots of every prompt's state (at message ends and every 2048\n"
             "tokens) as files in DIR: any later prompt, from any conversation, client,\n"
             "server sharing DIR or restart, prefills only what follows its longest stored\n"
             "prefix (default: off; DIR must exist)"},
    {.flag = "--prompt-cache-gb", SRV(prompt_cache_gb), .type = K3_OPT_DOUBLE, .lo = 1e-6,
     .hi = 1e6, .def = "32", .meta = "G",
     .help = "disk budget of --prompt-cache for this model's files, least recently used\n"
             "removed first (at K3 widths a snapshot is ~465 MB + 55 KB per token)"},
    {.flag = "--prompt-cache-ram", SRV(prompt_cache_ram), .type = K3_OPT_INT, .lo = 0,
     .hi = 64, .def = "1", .meta = "N",
     .help = "with --prompt-cache: keep the last N snapshots read back in RAM too (each\n"
             "counted by the memory plan as one more session)"},
    {.flag = "--state-dir", K3_OPT_CMD(serve_args, state_dir), .field = "state_dir",
     .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY, .meta = "DIR",
     .help = "the old name of --prompt-cache DIR (its files are now kept at exit)"},
    {.flag = "--state-files", K3_OPT_CMD(serve_args, state_files), .field = "state_files",
     .type = K3_OPT_INT, .lo = 1, .hi = 4096, .meta = "N",
     .help = "removed: the prompt cache is bounded by --prompt-cache-gb"},
    {.flag = "--allow-host", SRV(allow_host), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY,
     .meta = "NAMES",
     .help = "host names (comma-separated) a request's Host header may give besides\n"
             "localhost, an IP address or --host; others get 403 (a DNS-rebinding page);\n"
             "* allows any"},
    {.flag = "--allow-origin", SRV(allow_origin), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY,
     .meta = "ORIGINS",
     .help = "browser origins (comma-separated, e.g. http://localhost:3000) that may call\n"
             "the API besides k3's own page; other pages get 403; * allows any"},
    {.flag = "--request-timeout", SRV(request_timeout_s), .type = K3_OPT_DOUBLE, .lo = 0.001,
     .hi = 86400, .def = "30", .meta = "S",
     .help = "a request's headers and body must arrive within S seconds of the connection\n"
             "(or of the previous answer on a kept-alive one), else 408"},
    {.flag = "--max-connections", SRV(max_connections), .type = K3_OPT_INT, .lo = 1,
     .hi = 65536, .def = "256", .meta = "N",
     .help = "connections served at once (one thread each); more get 503 + Retry-After"},
    {.flag = "--max-connections-per-address", SRV(max_per_address), .type = K3_OPT_INT,
     .lo = 1, .hi = 65536, .meta = "N",
     .help = "of them from one client address (default: an eighth of --max-connections,\n"
             "at least 4; behind a reverse proxy every client has its address: raise it\n"
             "to --max-connections)"},
    {.flag = "--stall-timeout", SRV(stall_timeout_s), .type = K3_OPT_DOUBLE, .lo = 0.001,
     .hi = 86400, .def = "300", .meta = "S",
     .help = "a streaming client that reads nothing for S seconds while its reply waits\n"
             "(1 MiB unread) is cancelled and its slot freed"},
    {.flag = "--no-reuse", SRV(no_reuse), .type = K3_OPT_SWITCH, .value = 1,
     .help = "prefill every prompt from an empty state instead of reusing the kept\n"
             "conversation (same prompts, same output; slower)"},
    {.flag = "--temperature", SRV(temperature), .type = K3_OPT_DOUBLE, .lo = 0, .hi = 2,
     .def = "1", .meta = "T",
     .help = "temperature of requests that give none (0 = greedy; requests may ask for\n"
             "0 to 2)"},
    {.flag = "--effort", SRV(effort), .type = K3_OPT_WORD, .choices = efforts, .def = "max",
     .meta = "E", .help = "thinking effort of chat requests that give no reasoning_effort:\n"
                          "low, high or max"},
};

static const k3_cli_command serve_cmd = {
    .name = "serve",
    .usage =
        "usage: k3 serve [MODEL_DIR] [--host 127.0.0.1] [--port 8000] [options]\n"
        "\n"
        "Serves the model over an OpenAI-compatible HTTP API until Ctrl-C (SIGINT) or SIGTERM:\n"
        "  GET  /v1/models, /v1/models/ID   the one served model\n"
        "  POST /v1/chat/completions        chat (K3 chat format; thinking as reasoning_content)\n"
        "  POST /v1/completions             raw text completion of a prompt\n"
        "  POST /v1/messages                the Anthropic Messages API (and /count_tokens)\n"
        "  POST /v1/responses               OpenAI's Responses API (Codex)\n"
        "  GET  /health                     liveness and queue state (no key needed)\n"
        "  GET  /metrics                    Prometheus counters (needs the key when set)\n"
        "  GET  /                           the chat page, for a browser (no key needed)\n"
        "Each path also works without the /v1 prefix. Streaming (\"stream\": true) uses\n"
        "Server-Sent Events ending with data: [DONE]. One generation runs at a time\n"
        "unless --parallel N.\n"
        "Requests sample at temperature 1 and think at effort max unless they say otherwise\n"
        "(--temperature, --effort change these defaults). Without MODEL_DIR the bundled\n"
        "fixture model is used. -q also silences the per-request log.\n",
    .rows = serve_rows, .n_rows = sizeof serve_rows / sizeof *serve_rows,
    .groups = K3_OG_MODEL | K3_OG_SPEED | K3_OG_CTX,
    .max_positional = 1,
};

#ifdef K3_TEST_CONTROLS
/* The test build only (build/k3-test; server.h, k3_server_test_control): K3_TEST_* variables
 * set the server's test controls (replies replaced by a script, a pause after each token, a
 * smaller stream backlog, a prompt pass held). The shipped k3 reads none of them. Returns 0,
 * or 2 (reported). */
static int test_hooks(void) {
    const char *script = getenv("K3_TEST_SCRIPTED_REPLY");
    if (script && script[0]) k3_server_test_control(K3_SERVER_TEST_SCRIPTED_REPLY, script);
    const char *delay = getenv("K3_TEST_TOKEN_DELAY_MS");
    const char *backlog = getenv("K3_TEST_STREAM_BACKLOG_BYTES");
    const char *hold = getenv("K3_TEST_PASS_HOLD_S");
    const char *hold_at = getenv("K3_TEST_PASS_HOLD_POS");
    double ms = 0, hold_s = 0;
    long long bytes = 0, hold_pos = 0;
    k3_err err = {0};
    if ((delay && delay[0] &&
         k3_parse_double(delay, "K3_TEST_TOKEN_DELAY_MS", 0, 1000, &ms, &err)) ||
        (backlog && backlog[0] &&
         k3_parse_long(backlog, "K3_TEST_STREAM_BACKLOG_BYTES", 1, 1ll << 30, &bytes, &err)) ||
        (hold && hold[0] && k3_parse_double(hold, "K3_TEST_PASS_HOLD_S", 0, 600, &hold_s, &err)) ||
        (hold_at && hold_at[0] &&
         k3_parse_long(hold_at, "K3_TEST_PASS_HOLD_POS", 0, 1 << 30, &hold_pos, &err))) {
        k3_opts_error("serve", &err);
        return 2;
    }
    k3_server_test_control(K3_SERVER_TEST_PASS_HOLD, hold_s);
    k3_server_test_control(K3_SERVER_TEST_PASS_HOLD_POS, (int)hold_pos);
    k3_server_test_control(K3_SERVER_TEST_TOKEN_DELAY, ms / 1e3);
    k3_server_test_control(K3_SERVER_TEST_STREAM_BACKLOG, (size_t)bytes);
    return 0;
}
#else
static int test_hooks(void) { return 0; }
#endif

static int parse_args(int argc, char **argv, serve_args *a) {
    *a = (serve_args){0};
    k3_opts_parsed p;
    k3_opt_targets t = {&a->eo, &a->co, &a->cc, a};
    int rc = k3_opts_parse(&serve_cmd, argc, argv, &t, &p);
    if (rc) return rc;
    if ((rc = k3_model_arg("k3 serve", p.n_positional ? p.positional[0] : NULL, &a->model_dir)))
        return rc;
    if (p.n_positional && !a->so.model_id && strcmp(a->model_dir, p.positional[0]))
        a->so.model_id = p.positional[0]; /* a name, not its snapshot's revision */
    a->eo.verbose = !a->cc.quiet;
    a->so.log_requests = !a->cc.quiet;
    a->so.ctx = a->cc.ctx;
    a->eo.ctx = a->cc.ctx; /* the plan counts each session at its context */
    a->so.spec = a->co.spec;
    if (a->state_files) {
        return k3_opts_usage_error(&serve_cmd, "--state-files is gone: the prompt cache "
                                   "(--prompt-cache DIR) keeps files within --prompt-cache-gb G "
                                   "instead");
    }
    if (a->state_dir) { /* one mechanism: the spill folder became the prompt cache */
        if (a->so.prompt_cache) {
            return k3_opts_usage_error(&serve_cmd, "--state-dir is the old name of "
                                       "--prompt-cache: give one");
        }
        fprintf(stderr, "k3 serve: --state-dir is now --prompt-cache %s (snapshots shared by "
                "every conversation, kept across restarts)\n", a->state_dir);
        a->so.prompt_cache = a->state_dir;
    }
    a->so.chunk = a->co.chunk;
    /* every kept conversation is a session: the memory plan counts them, and each snapshot
     * the prompt cache keeps in RAM (at most a session's state and its ids) */
    a->eo.sessions = a->so.state_cache > a->so.parallel ? a->so.state_cache : a->so.parallel;
    if (!a->so.prompt_cache) a->so.prompt_cache_ram = 0;
    a->eo.sessions += a->so.prompt_cache_ram;
    if (a->eo.sessions < 1) a->eo.sessions = 1;
    a->eo.pass_sessions = a->so.parallel; /* each slot's pass-start copy (plan.h) */
    /* the plan counts the worker's prompt passes (expert-major prefill), as for run and chat:
     * --chunk ids, by default as many as it can give */
    if (a->co.chunk) a->eo.prompt_rows = a->co.chunk;
    return test_hooks();
}

/* True when every address `host` resolves to is a loopback one (127.0.0.0/8, ::1); the
 * default host (NULL) is 127.0.0.1. An unresolvable name counts as not loopback. */
static bool loopback_only(const char *host) {
    if (!host) return true;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) || !res) return false;
    bool lo = true;
    for (const struct addrinfo *r = res; r; r = r->ai_next) {
        if (r->ai_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)r->ai_addr;
            lo = lo && (ntohl(a->sin_addr.s_addr) >> 24) == 127;
        } else if (r->ai_family == AF_INET6) {
            const struct in6_addr *a = &((const struct sockaddr_in6 *)r->ai_addr)->sin6_addr;
            lo = lo && (IN6_IS_ADDR_LOOPBACK(a) ||
                        (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127));
        } else {
            lo = false;
        }
    }
    freeaddrinfo(res);
    return lo;
}

static int serve(const serve_args *a, k3_err *err) {
    k3_server *srv = NULL;
    k3_engine_opts eo = a->eo;
    k3_cli_model m;
    int rc = k3_cli_model_load(a->model_dir, &eo, &a->cc, &m, err);
    if (rc) return rc;
    k3_engine *e = m.e;
    rc = k3_server_start(e, a->model_dir, &a->so, &srv, err);
    if (rc) {
        k3_cli_model_free(&m);
        return rc;
    }
    k3_cli_catch_signals(K3_CLI_SIG_TERM);
    signal(SIGPIPE, SIG_IGN);
    char policy[512 + 4096 + 96];
    k3_server_describe_policy(srv, policy, sizeof policy);
    /* Always printed (also with -q): tests and scripts read the URL from this line. */
    printf("k3 serve: listening on %s/v1 (model \"%s\" from %s)\n", k3_server_url(srv),
           k3_server_model_id(srv), a->model_dir);
    printf("k3 serve: %s\n", policy);
    if (k3_engine_spine_int8(e)) {
        char spine[K3_DESCRIBE_CAP];
        k3_engine_describe(e, K3_DESCRIBE_SPINE, spine, sizeof spine);
        printf("k3 serve: %s\n", spine);
    }
    fflush(stdout);
    /* Also with -q: the chat page (GET /) and the API are reachable from the network. */
    if (!loopback_only(a->so.host))
        fprintf(stderr, "k3 serve: warning: --host %s is not a loopback address: the chat page "
                "(%s/) and the API are open to other machines%s\n", a->so.host,
                k3_server_url(srv), a->so.api_key && a->so.api_key[0] ? ""
                : "; anyone who can reach it can generate: set --api-key KEY (or K3_API_KEY)");
    while (!k3_cli_interrupted) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!a->cc.quiet) fprintf(stderr, "k3 serve: stopping\n");
    k3_server_stop(srv);
    k3_cli_model_free(&m);
    return K3_OK;
}

int k3_cmd_serve(int argc, char **argv) {
    serve_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    k3_err err = {0};
    rc = serve(&a, &err);
    if (rc) k3_opts_error("serve", &err);
    return rc;
}
