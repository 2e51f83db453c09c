/* cmd_setup.c — `k3 setup DEST`: install a snapshot over HTTP, in full or streaming. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../setup/setup.h"
#include "cli.h"
#include "interrupt.h"
#include "opts.h"

/* What the table parses beyond k3_setup_opts' own fields (converted after parsing). */
typedef struct setup_args {
    k3_setup_opts *o;
    int mode, connections, retries;
    double backoff_s, timeout_s, chunk_mb, free_bytes;
    const char *endpoint, *repo, *revision;
} setup_args;

#define SETUP(f) K3_OPT_CMD(setup_args, f), .field = #f
static const k3_opt setup_rows[] = {
    {.flag = "--full", SETUP(mode), .type = K3_OPT_SWITCH, .value = K3_SETUP_FULL,
     .help = "mode: every shard (1.56 TB for Kimi K3)"},
    {.flag = "--stream", SETUP(mode), .type = K3_OPT_SWITCH, .value = K3_SETUP_STREAM,
     .help = "mode: the spine only (~115 GB): routed experts are fetched with one range\n"
             "request each when the router first picks them, and kept"},
    {.flag = "--finish", SETUP(mode), .type = K3_OPT_SWITCH, .value = K3_SETUP_FINISH,
     .help = "mode: fetch every expert still missing (file-offset order, neighbours\n"
             "coalesced); DEST becomes a full install"},
    {.flag = "--check", SETUP(mode), .type = K3_OPT_SWITCH, .value = K3_SETUP_CHECK,
     .help = "mode: verify what DEST holds; fetches nothing"},
    {.flag = "--endpoint", .env = "HF_ENDPOINT", SETUP(endpoint), .type = K3_OPT_STR,
     .flags = K3_OPTF_NONEMPTY, .meta = "URL",
     .help = "server (default " K3_HF_ENDPOINT ")"},
    {.flag = "--repo", SETUP(repo), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY,
     .meta = "ID", .help = "repository (default " K3_HF_REPO ")"},
    {.flag = "--revision", SETUP(revision), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY,
     .meta = "REV", .help = "branch, tag or commit (default " K3_HF_REVISION "); DEST defaults to\n"
             "MODELS/REPO@REV for any other"},
    {.flag = "--connections", SETUP(connections), .type = K3_OPT_INT, .lo = 1, .hi = 64,
     .meta = "N", .help = "parallel keep-alive connections (default 4, or the last k3 setup's\n"
                          "into DEST; so for the three below)"},
    {.flag = "--retries", SETUP(retries), .type = K3_OPT_INT, .lo = 0, .hi = 100,
     .meta = "N", .help = "retries of a failed request: 5xx, timeout, reset, truncated or\n"
                          "mismatched answer (default 5; 0 = none)"},
    {.flag = "--backoff", SETUP(backoff_s), .type = K3_OPT_DOUBLE, .lo = 0.001, .hi = 600,
     .meta = "S", .help = "seconds before the first retry, doubled each time (default 0.5)"},
    {.flag = "--timeout", SETUP(timeout_s), .type = K3_OPT_DOUBLE, .lo = 1, .hi = 3600,
     .meta = "S", .help = "seconds to connect, and without a byte before a retry (default 30);\n"
             "a request not complete within S plus 1 s per 16 KiB is retried"},
    {.flag = "--chunk-mb", SETUP(chunk_mb), .type = K3_OPT_DOUBLE, .lo = 1.0 / 1024,
     .hi = 1 << 20, .meta = "N",
     .help = "largest single range request, MiB (default 64; fractions ok)"},
#ifdef K3_TEST_CONTROLS /* the test build only (build/k3-test; tests/setup/run.sh) */
    {.env = "K3_SETUP_FREE_BYTES", SETUP(free_bytes), .type = K3_OPT_DOUBLE, .lo = 0, .hi = 9e18,
     .flags = K3_OPTF_LAB, .help = "tests: assume this many free bytes instead of asking the "
                                   "file system"},
#endif
};

static const k3_cli_command setup_cmd = {
    .name = "setup",
    .usage =
        "usage: k3 setup [DEST | OWNER/NAME@REV] [--full | --stream | --finish | --check]\n"
        "                [options]\n"
        "\n"
        "Installs a Kimi K3 snapshot into the folder DEST from any server laid out like the\n"
        "Hugging Face hub: {endpoint}/{repo}/resolve/{revision}/{file}.\n"
        "DEST defaults to MODELS/REPO (REPO: --repo), where MODELS is $K3_MODELS, else\n"
        "$XDG_DATA_HOME/k3/models, else ~/.local/share/k3/models; there, the commands that\n"
        "take a model find it by name (k3 run " K3_HF_REPO "). A --revision other than\n"
        "main goes into its own folder, MODELS/REPO@REV, found as REPO@REV (k3 run\n"
        K3_HF_REPO "@REV); k3 setup OWNER/NAME@REV means --repo OWNER/NAME --revision REV\n"
        "into that folder. The install records its revision (.k3/setup.json): REPO@REV\n"
        "never takes a folder that holds another revision. It first fetches\n"
        "config.json, the index, the tokenizer files and every shard's header, then checks free\n"
        "space (refusing with the exact number of bytes to free) before writing anything.\n"
        "Every file is checked (length; sha256 when the server gives one) before it gets its\n"
        "final name. Interrupted runs (Ctrl-C, crash, lost connection) resume where they\n"
        "stopped when the same command is run again. Modes: at most one of --full, --stream,\n"
        "--finish, --check (default: --full when the disk has room for everything, else\n"
        "--stream).\n",
    .rows = setup_rows, .n_rows = sizeof setup_rows / sizeof *setup_rows,
    .groups = K3_OG_NET, /* HF_TOKEN */
    .epilog = "HF_TOKEN is sent only to the endpoint's host as a bearer token, never stored.\n"
              "K3_MODELS, XDG_DATA_HOME and HOME give the default DEST.\n"
              "Redirects are followed only to https: or to the endpoint's own host.\n"
              "exit status: 0 ok, 2 usage, 3 I/O, 5 a bad header or --check found a problem,\n"
              "10 network (after the retries), 11 not enough disk space, 130 interrupted.\n",
    .max_positional = 1,
};

/* `k3 setup OWNER/NAME@REV` is `k3 setup --repo OWNER/NAME --revision REV` (into the default
 * folder) when no folder of that name exists: the form the commands take a revision in. Given
 * with a --repo or --revision that says otherwise, it is a usage error. repo (256 bytes)
 * holds OWNER/NAME for o->repo. Returns 0 or K3_ERR_USAGE. */
static int name_at_revision(k3_setup_opts *o, char *repo) {
    const char *rev;
    struct stat st;
    if (!strchr(o->dest, '@') || stat(o->dest, &st) == 0 ||
        !k3_model_name_split(o->dest, repo, 256, &rev))
        return 0;
    char msg[1024];
    if ((o->repo && strcmp(o->repo, repo)) || (o->revision && strcmp(o->revision, rev))) {
        snprintf(msg, sizeof msg, "%s names %s at revision %s, but --repo %s --revision %s "
                 "say otherwise: give one of them", o->dest, repo, rev,
                 o->repo ? o->repo : repo, o->revision ? o->revision : rev);
        return k3_opts_usage_error(&setup_cmd, msg);
    }
    o->repo = repo, o->revision = rev, o->dest = NULL;
    return 0;
}

static int parse_args(int argc, char **argv, k3_setup_opts *o) {
    static char repo[256]; /* OWNER/NAME of OWNER/NAME@REV; main thread */
    setup_args a = {.o = o, .free_bytes = -1};
    k3_cli_common cc;
    k3_opts_parsed parsed;
    k3_opt_targets t = {.cc = &cc, .cmd = &a};
    int rc = k3_opts_parse(&setup_cmd, argc, argv, &t, &parsed);
    if (rc) return rc;
    int modes = k3_opts_given(&setup_cmd, &parsed, "--full") +
                k3_opts_given(&setup_cmd, &parsed, "--stream") +
                k3_opts_given(&setup_cmd, &parsed, "--finish") +
                k3_opts_given(&setup_cmd, &parsed, "--check");
    if (modes > 1)
        return k3_opts_usage_error(&setup_cmd, "give at most one of --full, --stream, --finish, "
                                   "--check");
    o->mode = (enum k3_setup_mode)a.mode;
    o->endpoint = a.endpoint, o->repo = a.repo, o->revision = a.revision;
    o->dest = parsed.n_positional ? parsed.positional[0] : NULL;
    if (o->dest && (rc = name_at_revision(o, repo))) return rc;
    if (!o->dest && k3_setup_default_dest(o->repo ? o->repo : K3_HF_REPO, o->revision, &o->dest))
        return K3_ERR_USAGE; /* MODELS/REPO[@REV], where commands find it by name (model_dir.h) */
    o->token = cc.hf_token && cc.hf_token[0] ? cc.hf_token : NULL;
    o->connections = a.connections;
    /* k3_http_opts: 0 is the default (or the manifest's), -1 none */
    o->retries = k3_opts_given(&setup_cmd, &parsed, "--retries") && !a.retries ? -1 : a.retries;
    o->backoff_s = a.backoff_s, o->timeout_s = a.timeout_s;
    o->chunk_bytes = (uint64_t)(a.chunk_mb * 1048576.0);
    o->free_bytes = a.free_bytes < 0 ? -1 : (int64_t)a.free_bytes;
    return 0;
}

int k3_cmd_setup(int argc, char **argv) {
    k3_setup_opts o = {.free_bytes = -1, .log = stderr, .interrupt = &k3_cli_interrupted,
                       .progress_bar = isatty(STDERR_FILENO) != 0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    k3_cli_catch_sigint();
    k3_err err = {0};
    rc = k3_setup_run(&o, &err);
    if (rc) k3_opts_error("setup", &err);
    return rc;
}
