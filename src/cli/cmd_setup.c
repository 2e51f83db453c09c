/* cmd_setup.c — `k3 setup DEST`: install a snapshot over HTTP, in full or streaming. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../setup/setup.h"
#include "cli.h"
#include "interrupt.h"
#include "opts.h"

static void setup_usage(FILE *f) {
    fprintf(f,
        "usage: k3 setup [DEST] [--full | --stream | --finish | --check] [options]\n"
        "\n"
        "Installs a Kimi K3 snapshot into the folder DEST from any server laid out like the\n"
        "Hugging Face hub: {endpoint}/{repo}/resolve/{revision}/{file}.\n"
        "DEST defaults to MODELS/REPO (REPO: --repo), where MODELS is $K3_MODELS, else\n"
        "$XDG_DATA_HOME/k3/models, else ~/.local/share/k3/models; there, the commands that\n"
        "take a model find it by name (k3 run " K3_HF_REPO "). It first fetches\n"
        "config.json, the index, the tokenizer files and every shard's header, then checks free\n"
        "space (refusing with the exact number of bytes to free) before writing anything.\n"
        "Every file is checked (length; sha256 when the server gives one) before it gets its\n"
        "final name. Interrupted runs (Ctrl-C, crash, lost connection) resume where they\n"
        "stopped when the same command is run again.\n"
        "\n"
        "modes (default: --full when the disk has room for everything, else --stream):\n"
        "  --full             every shard (1.56 TB for Kimi K3)\n"
        "  --stream           the spine only (~115 GB): routed experts are fetched with one\n"
        "                     range request each when the router first picks them, and kept\n"
        "  --finish           fetch every expert still missing (file-offset order, neighbours\n"
        "                     coalesced); DEST becomes a full install\n"
        "  --check            verify what DEST holds; fetches nothing\n"
        "\n"
        "options:\n"
        "  --endpoint URL     server (default: $HF_ENDPOINT, else " K3_HF_ENDPOINT ")\n"
        "  --repo ID          repository (default " K3_HF_REPO ")\n"
        "  --revision REV     branch, tag or commit (default " K3_HF_REVISION ")\n"
        "  --connections N    parallel keep-alive connections (default 4)\n"
        "  --retries N        retries of a failed request: 5xx, timeout, reset, truncated or\n"
        "                     mismatched answer (default 5; 0 = none)\n"
        "  --backoff S        seconds before the first retry, doubled each time (default 0.5)\n"
        "  --timeout S        seconds to connect, and without a byte before a retry (default 30)\n"
        "  --chunk-mb N       largest single range request, MiB (default 64; fractions ok)\n"
        "  -h, --help         this help\n"
        "\n"
        "environment: HF_TOKEN (bearer token, sent only to the endpoint's host, never stored),\n"
        "HF_ENDPOINT, K3_MODELS, XDG_DATA_HOME and HOME (the default DEST),\n"
        "K3_SETUP_FREE_BYTES (assume this many free bytes; for tests).\n"
        "Redirects are followed only to https: or to the endpoint's own host.\n"
        "exit status: 0 ok, 2 usage, 3 I/O, 5 a bad header or --check found a problem,\n"
        "10 network (after the retries), 11 not enough disk space, 130 interrupted.\n");
}

static int num(const char *s, const char *flag, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "k3 setup: %s needs a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return K3_ERR_USAGE;
    }
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, k3_setup_opts *o) {
    int modes = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        double v = 0;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { setup_usage(stdout); return -1; }
        else if (!strcmp(a, "--full")) o->mode = K3_SETUP_FULL, modes++;
        else if (!strcmp(a, "--stream")) o->mode = K3_SETUP_STREAM, modes++;
        else if (!strcmp(a, "--finish")) o->mode = K3_SETUP_FINISH, modes++;
        else if (!strcmp(a, "--check")) o->mode = K3_SETUP_CHECK, modes++;
        else if (!strcmp(a, "--endpoint") && has_val) o->endpoint = argv[++i];
        else if (!strcmp(a, "--repo") && has_val) o->repo = argv[++i];
        else if (!strcmp(a, "--revision") && has_val) o->revision = argv[++i];
        else if (!strcmp(a, "--connections") && has_val) {
            if (!(rc = num(argv[++i], a, 1, 64, &v))) o->connections = (int)v;
        } else if (!strcmp(a, "--retries") && has_val) {
            if (!(rc = num(argv[++i], a, 0, 100, &v))) o->retries = v == 0 ? -1 : (int)v;
        } else if (!strcmp(a, "--backoff") && has_val) {
            if (!(rc = num(argv[++i], a, 0.001, 600, &v))) o->backoff_s = v;
        } else if (!strcmp(a, "--timeout") && has_val) {
            if (!(rc = num(argv[++i], a, 1, 3600, &v))) o->timeout_s = v;
        } else if (!strcmp(a, "--chunk-mb") && has_val) {
            if (!(rc = num(argv[++i], a, 1.0 / 1024, 1 << 20, &v)))
                o->chunk_bytes = (uint64_t)(v * 1048576.0);
        } else if (a[0] != '-' && !o->dest) o->dest = a;
        else {
            fprintf(stderr, "k3 setup: unknown option or missing value: '%s' (see k3 setup "
                    "--help)\n", a);
            return K3_ERR_USAGE;
        }
        if (rc) return rc;
    }
    if (!o->dest && k3_setup_default_dest(o->repo ? o->repo : K3_HF_REPO, &o->dest))
        return K3_ERR_USAGE; /* MODELS/REPO, where commands find it by name (model_dir.h) */
    if (modes > 1) {
        fprintf(stderr, "k3 setup: give at most one of --full, --stream, --finish, --check\n");
        return K3_ERR_USAGE;
    }
    return 0;
}

int k3_cmd_setup(int argc, char **argv) {
    k3_setup_opts o = {.free_bytes = -1, .log = stderr, .interrupt = &k3_cli_interrupted,
                       .progress_bar = isatty(STDERR_FILENO) != 0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    /* the option table's variables (opts.c): the only place that reads the environment */
    const char *ep = k3_opts_env("HF_ENDPOINT"), *tok = k3_opts_env("HF_TOKEN");
    const char *fake = k3_opts_env("K3_SETUP_FREE_BYTES");
    if (!o.endpoint && ep && ep[0]) o.endpoint = ep;
    if (tok && tok[0]) o.token = tok;
    if (fake && fake[0]) {
        double v;
        if (num(fake, "K3_SETUP_FREE_BYTES", 0, 9e18, &v)) return K3_ERR_USAGE;
        o.free_bytes = (int64_t)v;
    }
    k3_cli_catch_sigint();
    k3_err err = {0};
    rc = k3_setup_run(&o, &err);
    if (rc) fprintf(stderr, "k3 setup: %s\n", err.msg);
    return rc;
}
