/* test_opts.c — the option table (src/cli/opts.h) through the real ./k3 and in-process:
 * --flag=value, a repeated flag, --prompt - and --prompt-file, the Done-when commands,
 * precedence (flag > variable > default), bad values refused with the range (every double
 * option refuses inf, nan and 1e30: issue 20 D10), an empty API key refused (D11), generated
 * help listing every shared group, the library reading no environment, and field names in
 * library errors mapped to flags. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/cli/opts.h"
#include "../src/engine/k3.h"
#include "../src/server/server.h"
#include "../src/server/srv.h"
#include "../src/util/parse.h"
#include "cli_run.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define GEN "run " NANO " --max-new 3 --ids -q"

/* stdout of a run that must succeed (malloc'd), or NULL after recording the failure. */
static char *ids_of(const char *args) {
    k3t_cli r = {0};
    if (k3t_cli_run(args, &r)) return NULL;
    CHECK_OR(NULL, r.status == 0 && r.out[0], "k3 %s: exit %d: %s", args, r.status, r.err);
    char *out = strdup(r.out);
    k3t_cli_free(&r);
    return out;
}

/* Runs `sh -c SCRIPT` (stdin /dev/null), capturing its output. */
static int sh(const char *script, k3t_cli *r) {
    char args[4096];
    snprintf(args, sizeof args, "-c '%s'", script);
    return k3t_cli_run_in(NULL, "/bin/sh", args, r);
}

static void test_flag_equals_value(void) {
    char *a = ids_of(GEN " --prompt hello --temperature 0.5 --seed 7 --top-k 4");
    char *b = ids_of("run " NANO " --max-new=3 --ids -q --prompt=hello --temperature=0.5 "
                     "--seed=7 --top-k=4");
    CHECK(a && b && !strcmp(a, b), "--flag=value: '%s' vs '%s'", b ? b : "", a ? a : "");
    /* the Done-when's spelling */
    k3t_cli r = {0};
    if (!k3t_cli_run("run --prompt=hi --max-new=2", &r))
        CHECK(r.status == 0 && strstr(r.err, "generated 2 tokens"), "exit %d: %s", r.status,
              r.err);
    k3t_cli_free(&r);
    free(a), free(b);
}

static void test_repeated_flag(void) {
    static const char *args[] = {GEN " --prompt hi --threads 1 --threads 2",
                                 GEN " --prompt hi --max-new=4",
                                 "serve " NANO " --port 0 --port=1"};
    static const char *named[] = {"--threads", "--max-new", "--port"};
    for (int i = 0; i < 3; i++) {
        k3t_cli r = {0};
        if (k3t_cli_run(args[i], &r)) continue;
        char want[64];
        snprintf(want, sizeof want, ": %s is given twice", named[i]);
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, want) && !r.out[0], "k3 %s: exit %d: %s",
              args[i], r.status, r.err);
        k3t_cli_free(&r);
    }
}

static void test_prompt_stdin_and_file(void) {
    char *want = ids_of(GEN " --prompt 'The quick fox'");
    char *dir = k3t_tmpdir(), path[512], script[2048];
    if (!want || !dir) goto done;
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    FILE *f = fopen(path, "w");
    if (f) fputs("The quick fox", f), fclose(f);
    char args[1024];
    snprintf(args, sizeof args, GEN " --prompt-file %s", path);
    char *from_file = ids_of(args);
    CHECK(from_file && !strcmp(from_file, want), "--prompt-file: %s vs %s",
          from_file ? from_file : "", want);
    free(from_file);
    k3t_cli r = {0};
    snprintf(script, sizeof script, "printf \"The quick fox\" | %s " GEN " --prompt -",
             k3t_bin());
    if (!sh(script, &r))
        CHECK(r.status == 0 && !strcmp(r.out, want), "--prompt -: exit %d, out %s, err %s",
              r.status, r.out, r.err);
    k3t_cli_free(&r);
    /* the text "-" itself is another prompt: stdin was read, not the dash */
    char *dash = ids_of(GEN " --prompt=--");
    CHECK(dash && strcmp(dash, want), "--prompt - gave the same ids as the text '-'");
    free(dash);
    snprintf(args, sizeof args, GEN " --prompt hi --prompt-file %s", path);
    if (!k3t_cli_run(args, &r))
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "exactly one of --prompt"), "%s", r.err);
    k3t_cli_free(&r);
done:
    free(want);
    k3t_rm_dir(dir);
}

/* Done-when: serve with the shared groups starts (and is stopped: timeout sends SIGINT). */
static void test_serve_accepts_shared_groups(void) {
    char script[1024];
    snprintf(script, sizeof script, "timeout -s INT 20 %s serve " NANO " --port 0 --device cpu "
             "--expert-gb 2 --spine-gb 1 --threads 2 --chunk 16 --effort low "
             "--temperature 0.3 | head -n 1", k3t_bin());
    k3t_cli r = {0};
    if (sh(script, &r)) return;
    CHECK(strstr(r.out, "k3 serve: listening on http://127.0.0.1:"), "out %s, err %s", r.out,
          r.err);
    CHECK(strstr(r.err, "spine budget") && strstr(r.err, "2 threads"), "load lines: %s", r.err);
    k3t_cli_free(&r);
}

/* Done-when: chat takes --device and --load-state (a state k3 run saved) and continues it. */
static void test_chat_load_state(void) {
    char *dir = k3t_tmpdir(), args[1024];
    if (!dir) return;
    k3t_cli r = {0}, c = {0};
    snprintf(args, sizeof args, "run " NANO " --prompt hi --max-new 2 --save-state %s/s.k3",
             dir);
    int pos = -1;
    if (!k3t_cli_run(args, &r)) {
        const char *p = strstr(r.err, "saved the state after ");
        int got = p ? sscanf(p, "saved the state after %d", &pos) : 0;
        CHECK(r.status == 0 && got == 1, "exit %d: %s", r.status, r.err);
    }
    snprintf(args, sizeof args, "chat " NANO " --device auto --load-state %s/s.k3", dir);
    if (pos > 0 && !k3t_cli_run(args, &c)) {
        char want[96];
        snprintf(want, sizeof want, "continuing the %d positions saved in", pos);
        CHECK(c.status == 0 && strstr(c.err, want), "exit %d: %s", c.status, c.err);
    }
    k3t_cli_free(&r);
    k3t_cli_free(&c);
    k3t_rm_dir(dir);
}

/* --save-state to a folder that cannot be written fails before the model loads or generates,
 * naming the path the user gave (not a .tmp file). */
static void test_save_state_checked_first(void) {
    static const char *cmds[] = {"run " NANO " --prompt hi --max-new 2", "chat " NANO};
    for (int i = 0; i < 2; i++) {
        char args[512];
        snprintf(args, sizeof args, "%s --save-state /nonexistent-k3/dir/s.k3", cmds[i]);
        k3t_cli r = {0};
        if (k3t_cli_run(args, &r)) continue;
        CHECK(r.status == K3_ERR_IO && strstr(r.err, "--save-state /nonexistent-k3/dir/s.k3") &&
              !strstr(r.err, ".tmp") && !strstr(r.err, "loaded") && !r.out[0],
              "k3 %s: exit %d, out %s, err %s", args, r.status, r.out, r.err);
        k3t_cli_free(&r);
    }
}

/* The plan line's prefetch: default prev+lookahead; K3_PIPE=prev beats the default; the
 * flag beats the variable (same spelling for both). */
static void test_precedence(void) {
    static const struct { const char *env, *flag, *want; } cases[] = {
        {"", "", "prefetch prev+lookahead (auto: a predictor pauses"},
        {"K3_PIPE=prev ", "", "prefetch prev\n"},
        {"K3_PIPE=prev ", "--pipe lookahead", "prefetch lookahead\n"},
        {"K3_PIPE=lookahead ", "--pipe=prev", "prefetch prev\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char script[1024];
        snprintf(script, sizeof script, "%s%s run " NANO " --prompt hi --max-new 1 %s",
                 cases[i].env, k3t_bin(), cases[i].flag);
        k3t_cli r = {0};
        if (sh(script, &r)) continue;
        CHECK(r.status == 0 && strstr(r.err, cases[i].want), "%s: want '%s' in %s", script,
              cases[i].want, r.err);
        k3t_cli_free(&r);
    }
}

/* D10: every double option refuses inf, nan and out-of-range values with its range, by flag
 * and by variable. */
static void test_bad_values_name_range(void) {
    static const struct { const char *args, *want; } cases[] = {
        {"run --prompt hi --expert-gb inf", "--expert-gb='inf': expected a finite number in (0, 1e+06]"},
        {"run --prompt hi --expert-gb 1e30", "--expert-gb='1e30': expected a finite number in (0, 1e+06]"},
        {"run --prompt hi --spine-gb nan", "--spine-gb='nan': expected a finite number in [0, 1e+06]"},
        {"run --prompt hi --temperature inf", "--temperature='inf': expected a finite number"},
        {"run --prompt hi --top-p 0", "--top-p='0': expected a finite number in (0, 1]"},
        {"serve --port 99999", "k3 serve: --port='99999': expected an integer in [0, 65535]"},
        {"serve --temperature 3", "k3 serve: --temperature='3': expected a finite number in [0, 2]"},
        {"chat --pipe sometimes", "k3 chat: --pipe='sometimes': expected one of 0, off, 1, on"},
        {"quality --builtin --threads 0", "k3 quality: --threads='0': expected an integer in [1, 1024]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        k3t_cli r = {0};
        if (k3t_cli_run(cases[i].args, &r)) continue;
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, cases[i].want), "k3 %s: exit %d: %s",
              cases[i].args, r.status, r.err);
        k3t_cli_free(&r);
    }
    k3t_cli r = {0};
    char script[512];
    snprintf(script, sizeof script, "K3_EXPERT_GB=inf %s run --prompt hi", k3t_bin());
    if (!sh(script, &r))
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "k3 run: K3_EXPERT_GB='inf': expected "
              "a finite number in (0, 1e+06]"), "exit %d: %s", r.status, r.err);
    k3t_cli_free(&r);
}

/* In-process: every double row of the table refuses inf, nan and 1e30 (D10). */
static void test_every_double_row_finite(void) {
    size_t n;
    const k3_opt *t = k3_opts_table(&n);
    k3_cli_command cmd = {.name = "test", .usage = "", .groups = ~0u};
    int doubles = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].type != K3_OPT_DOUBLE) continue;
        doubles++;
        static const char *bad[] = {"inf", "-inf", "nan", "1e30", "1e999"};
        for (int b = 0; b < 5; b++) {
            k3_engine_opts eo;
            k3_cli_chat_opts co;
            k3_cli_common cc;
            k3_opt_targets tg = {&eo, &co, &cc, NULL};
            k3_opts_parsed p;
            char *argv[] = {"test", (char *)t[i].flag, (char *)bad[b], NULL};
            CHECK(k3_opts_parse(&cmd, 3, argv, &tg, &p) == K3_ERR_USAGE, "%s %s accepted",
                  t[i].flag, bad[b]);
        }
    }
    CHECK(doubles >= 5, "only %d double rows", doubles);
}

/* D11: an empty API key is an error, by flag, by variable and in the server's options. */
static void test_empty_api_key(void) {
    k3t_cli r = {0};
    if (!k3t_cli_run("serve " NANO " --port 0 --api-key ''", &r))
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "k3 serve: --api-key is empty") &&
              !strstr(r.out, "listening"), "exit %d: %s", r.status, r.err);
    k3t_cli_free(&r);
    char script[512];
    snprintf(script, sizeof script, "K3_API_KEY= timeout -s INT 20 %s serve " NANO " --port 0",
             k3t_bin());
    if (!sh(script, &r))
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "K3_API_KEY is empty") &&
              !strstr(r.out, "listening"), "exit %d: %s", r.status, r.err);
    k3t_cli_free(&r);
    k3_server_opts so = {.port = 0, .api_key = ""};
    k3_server *srv = NULL;
    k3_err err = {0};
    CHECK(k3_server_start(NULL, NANO, &so, &srv, &err) == K3_ERR_USAGE && !srv &&
          strstr(err.msg, "api_key is empty"), "k3_server_start with api_key \"\": %s", err.msg);
}

/* --help of each command is the table: every row of every group it draws is listed. */
static void test_help_lists_shared_groups(void) {
    static const struct { const char *cmd; unsigned groups; } cmds[] = {
        {"run", K3_OG_MODEL | K3_OG_TRACE | K3_OG_SPEED | K3_OG_SAMPLING | K3_OG_CHAT | K3_OG_CTX | K3_OG_STATE},
        {"chat", K3_OG_MODEL | K3_OG_TRACE | K3_OG_SPEED | K3_OG_SAMPLING | K3_OG_CHAT | K3_OG_CTX | K3_OG_STATE},
        {"serve", K3_OG_MODEL | K3_OG_SPEED | K3_OG_CTX},
        {"quality", K3_OG_DEVICE | K3_OG_THREADS | K3_OG_KERNELS | K3_OG_BUDGET | K3_OG_QUIET},
    };
    size_t n;
    const k3_opt *t = k3_opts_table(&n);
    for (size_t c = 0; c < sizeof cmds / sizeof *cmds; c++) {
        char args[64];
        snprintf(args, sizeof args, "%s --help", cmds[c].cmd);
        k3t_cli r = {0};
        if (k3t_cli_run(args, &r)) continue;
        CHECK(r.status == 0, "k3 %s: exit %d", args, r.status);
        for (size_t i = 0; i < n; i++) {
            if (!(t[i].group & cmds[c].groups)) continue;
            char want[96];
            snprintf(want, sizeof want, "  %s%s%s%s", t[i].flag ? "" : "",
                     t[i].flag ? t[i].flag : t[i].env, t[i].meta ? " " : "",
                     t[i].meta ? t[i].meta : "");
            if (t[i].alias) snprintf(want, sizeof want, "%s, %s", t[i].alias, t[i].flag);
            CHECK(strstr(r.out, want), "k3 %s does not list '%s'", args, want);
            if (t[i].env && t[i].flag) CHECK(strstr(r.out, t[i].env), "k3 %s: no %s", args,
                                             t[i].env);
        }
        k3t_cli_free(&r);
    }
    k3t_cli r = {0};
    if (!k3t_cli_run("serve --help", &r))
        CHECK(strstr(r.out, "--temperature T") && strstr(r.out, "(default 1)") &&
              strstr(r.out, "--effort E") && strstr(r.out, "(default max)"), "%s", r.out);
    k3t_cli_free(&r);
}

/* Every command of k3 and k3-lab parses through the table: an unknown flag is named with
 * the command's help, a bad number names its flag and range, and --help lists the command's
 * own flags. */
static void test_every_command_on_the_table(void) {
    static const struct {
        int lab;              /* 1: k3-lab */
        const char *cmd;      /* the command (and its benchmark) */
        const char *bad;      /* a flag with a bad number, or NULL */
        const char *want;     /* what the refusal of `bad` says */
        const char *listed;   /* a flag --help must list */
    } cmds[] = {
        {0, "pack", "--quality-tokens 1", "--quality-tokens='1': expected an integer in [2, ",
         "  --no-quality"},
        {0, "pack", "--threads 0", "--threads='0': expected an integer in [1, 1024]",
         "  --threads N"},
        {0, "setup", "--connections 65", "--connections='65': expected an integer in [1, 64]",
         "  --chunk-mb N"},
        {0, "render", NULL, NULL, "  --segments"},
        {0, "tokenize", NULL, NULL, "  --special"},
        {0, "detokenize", NULL, NULL, "  --file PATH"},
        {0, "version", NULL, NULL, "  --kernels PATH"},
        {0, "plan", "--sessions 0", "--sessions='0': expected an integer in [1, 4096]",
         "  --sessions N"},
        {0, "run", "--threads x", "--threads='x': expected an integer", "  --max-new N"},
        {0, "quality", "--threads 0", "--threads='0'", "  --threads N"},
        {1, "bench io", "--threads 0", "--threads='0': expected an integer in [1, 256]",
         "  --no-fio"},
        {1, "bench kernels", "--seconds 0", "--seconds='0': expected a finite number in (0, ",
         "  --kernels PATH"},
        {1, "bench decode", "--spine-gb -1", "--spine-gb='-1': expected a finite number in [0, ",
         "  --spine-gb G"},
        {1, "bench prefill", "--tokens 0", "--tokens='0': expected an integer in [1, ",
         "  --chunks LIST"},
        {1, "bench spec", "--spec 0", "--spec='0': expected an integer in [1, 255]",
         "  --max-new N"},
        {1, "bench-batch", "--prompt 0", "--prompt='0': expected an integer in [1, 16384]",
         "  --sessions LIST"},
        {1, "bench-gpu", "--reps 0", "--reps='0': expected an integer in [1, ",
         "  K3_GPU_LAYERS"},
        {1, "synth", "--layers 1", "--layers='1': expected an integer in [2, ",
         "  --expert-shards N"},
        {1, "replay", NULL, NULL, "  --percent LIST"},
        {1, "trace-gen", "--hot-mass 2", "--hot-mass='2': expected a finite number in [0, 1]",
         "  --seed N"},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        const char *prog = cmds[i].lab ? "k3-lab" : "k3";
        char args[256], want[256];
        k3t_cli r = {0};
        snprintf(args, sizeof args, "%s --no-such-flag", cmds[i].cmd);
        if (!(cmds[i].lab ? k3t_lab_run(args, &r) : k3t_cli_run(args, &r))) {
            snprintf(want, sizeof want, "%s %s: unknown option '--no-such-flag' (see %s %s "
                     "--help)", prog, cmds[i].cmd, prog, cmds[i].cmd);
            CHECK(r.status == K3_ERR_USAGE && strstr(r.err, want), "%s %s: exit %d: %s", prog,
                  args, r.status, r.err);
        }
        k3t_cli_free(&r);
        snprintf(args, sizeof args, "%s --help", cmds[i].cmd);
        if (!(cmds[i].lab ? k3t_lab_run(args, &r) : k3t_cli_run(args, &r)))
            CHECK(r.status == 0 && strstr(r.out, cmds[i].listed) && strstr(r.out, "-h, --help"),
                  "%s %s: exit %d, no '%s' in %s", prog, args, r.status, cmds[i].listed, r.out);
        k3t_cli_free(&r);
        if (!cmds[i].bad) continue;
        snprintf(args, sizeof args, "%s %s", cmds[i].cmd, cmds[i].bad);
        if (!(cmds[i].lab ? k3t_lab_run(args, &r) : k3t_cli_run(args, &r))) {
            snprintf(want, sizeof want, "%s %s: %s", prog, cmds[i].cmd, cmds[i].want);
            CHECK(r.status == K3_ERR_USAGE && strstr(r.err, want), "%s %s: exit %d: %s", prog,
                  args, r.status, r.err);
        }
        k3t_cli_free(&r);
    }
}

/* serve's --temperature / --effort are the defaults of requests that leave them out. */
static void test_server_defaults(void) {
    k3_server_opts so = {.temperature = 0.25, .effort = "low"};
    static const struct { const char *body; double temperature; const char *effort; } cases[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 0.25, "low"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": 0.5}", 0.5, "low"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": null, \"reasoning_effort\": \"high\"}", 0.25, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *root = cJSON_Parse(cases[i].body);
        k3_srv_params p;
        k3_api_error e;
        int rc = k3_srv_parse_params(root, K3_SRV_CHAT, 0, &p, &e);
        if (!rc) k3_srv_apply_defaults(root, &so, &p);
        CHECK(rc == 0 && p.temperature == cases[i].temperature &&
              (cases[i].effort ? p.effort && !strcmp(p.effort, cases[i].effort) : !p.effort),
              "%s: temperature %g, effort %s", cases[i].body, p.temperature,
              p.effort ? p.effort : "(request's)");
        if (!rc) k3_srv_params_free(&p);
        cJSON_Delete(root);
    }
}

static void test_seed_unused_warning(void) {
    k3t_cli r = {0};
    if (!k3t_cli_run(GEN " --prompt hi --seed 5", &r))
        CHECK(r.status == 0 && strstr(r.err, "k3 run: warning: --seed is unused at temperature 0"),
              "exit %d: %s", r.status, r.err);
    k3t_cli_free(&r);
    if (!k3t_cli_run(GEN " --prompt hi --seed 5 --temperature 0.7", &r))
        CHECK(r.status == 0 && !strstr(r.err, "warning"), "warned while sampling: %s", r.err);
    k3t_cli_free(&r);
}

/* k3 pack --out DIR creates a missing DIR, and names it when it cannot. */
static void test_pack_out_created(void) {
    char *dir = k3t_tmpdir(), args[1024], sub[600];
    if (!dir) return;
    snprintf(sub, sizeof sub, "%s/new-pack", dir);
    snprintf(args, sizeof args, "pack " NANO " --out %s --no-quality -q", sub);
    k3t_cli r = {0};
    struct stat st;
    if (!k3t_cli_run(args, &r))
        CHECK(r.status == 0 && stat(sub, &st) == 0 && S_ISDIR(st.st_mode), "exit %d: %s",
              r.status, r.err);
    k3t_cli_free(&r);
    snprintf(args, sizeof args, "pack " NANO " --out %s/no/such/dir --no-quality -q", dir);
    if (!k3t_cli_run(args, &r))
        CHECK(r.status == K3_ERR_IO && strstr(r.err, "k3 pack: --out ") &&
              strstr(r.err, "/no/such/dir: the folder does not exist and cannot be created"),
              "exit %d: %s", r.status, r.err);
    k3t_cli_free(&r);
    k3t_rm_dir(dir);
}

/* The library reads no environment: a bad K3_EXPERT_GB / K3_DEVICE / K3_KERNELS does not reach
 * k3_engine_load, and the options' own values are checked there, naming the field. */
static void test_library_reads_no_environment(void) {
    setenv("K3_EXPERT_GB", "bogus", 1);
    setenv("K3_DEVICE", "bogus", 1);
    setenv("K3_KERNELS", "bogus", 1);
    k3_engine *e = NULL;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 1;
    int rc = k3_engine_load(NANO, &o, &e, &err);
    unsetenv("K3_EXPERT_GB");
    unsetenv("K3_DEVICE");
    unsetenv("K3_KERNELS");
    CHECK(rc == 0, "k3_engine_load read the environment: %s", err.msg);
    k3_engine_free(e);
    o.expert_gb = INFINITY;
    CHECK(k3_engine_load(NANO, &o, &e, &err) == K3_ERR_USAGE && strstr(err.msg, "expert_gb"),
          "expert_gb inf: %s", err.msg);
    o = k3_engine_opts_default();
    o.spine_gb = NAN;
    CHECK(k3_engine_load(NANO, &o, &e, &err) == K3_ERR_USAGE && strstr(err.msg, "spine_gb"),
          "spine_gb nan: %s", err.msg);
}

/* Library errors name fields (k3_fail_field / k3_fail_opts record which, and where); the edge
 * shows the flag that sets each where its name stood, without searching the text: a word that
 * only looks like a field stays as it is, also after the message is prefixed. */
static void test_fields_map_to_flags(void) {
    k3_err err = {0};
    char text[sizeof err.msg + 256];
    k3_fail_field(&err, K3_ERR_USAGE, "spine_gb", " %g: expected a number", 2e6);
    CHECK(!strcmp(err.msg, "spine_gb 2e+06: expected a number") &&
          !strcmp(err.field[0].name, "spine_gb") && err.field[0].at == 0, "%s / %s", err.msg,
          err.field[0].name);
    CHECK(!strcmp(k3_opts_render(&err, text, sizeof text), "--spine-gb 2e+06: expected a number"),
          "%s", text);
    k3_fail(&err, K3_ERR_USAGE, "expert_gb alone is no field");
    CHECK(!err.field[0].name[0], "k3_fail left the field %s", err.field[0].name);
    CHECK(!strcmp(k3_opts_render(&err, text, sizeof text), "expert_gb alone is no field"), "%s",
          text);
    /* advice anywhere in the text; a path holding the same word earlier is left alone */
    k3_fail_opts(&err, K3_ERR_INPUT, "ctx", "%s holds 9 positions but the context is 4 (raise ctx)",
                 "/m/ctx/a.state");
    k3_err_prefix(&err, "loading %s", "state");
    CHECK(!strcmp(k3_opts_render(&err, text, sizeof text), "loading state: /m/ctx/a.state holds 9 "
                  "positions but the context is 4 (raise --ctx)"), "%s", text);
    k3_fail_opts(&err, K3_ERR_DEVICE, "gpu_gb,ctx", "too small: raise gpu_gb or lower ctx");
    CHECK(!strcmp(k3_opts_render(&err, text, sizeof text),
                  "too small: raise --gpu-gb or lower --ctx"), "%s", text);
    k3_fail_opts(&err, K3_ERR_USAGE, "ctx,not_a_field", "my_ctx is not ctx_x nor ctxs");
    CHECK(!err.field[0].name[0] && !strcmp(k3_opts_render(&err, text, sizeof text), err.msg),
          "a look-alike word was taken for a field: %s", text);
    k3_fail_opts(&err, K3_ERR_USAGE, "not_a_field", "raise not_a_field");
    CHECK(!strcmp(k3_opts_render(&err, text, sizeof text), "raise not_a_field"), "%s", text);
    char tiny[12];
    k3_fail_opts(&err, K3_ERR_INPUT, "ctx", "a long message that ends: raise ctx");
    CHECK(!strcmp(k3_opts_render(&err, tiny, sizeof tiny), "a long mess"), "cut: %s", tiny);
    static const struct { const char *field, *flag; } map[] = {
        {"spine_gb", "--spine-gb"}, {"expert_gb", "--expert-gb"}, {"device", "--device"},
        {"kernels", "--kernels"}, {"ctx", "--ctx"}, {"gpu_gb", "--gpu-gb"}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        const char *f = k3_opts_flag_of(map[i].field);
        CHECK(f && !strcmp(f, map[i].flag), "%s -> %s", map[i].field, f ? f : "(none)");
    }
    CHECK(!k3_opts_flag_of("my_expert_gb") && !k3_opts_flag_of(""), "a non-field mapped");
    /* end to end: the engine's own checks, printed with the flag */
    static const struct { const char *args, *want; } cli[] = {
        {"run " NANO " --prompt hi --kernels bogus", "k3 run: --kernels 'bogus': unknown"},
        {"run " NANO " --prompt hi --spine-gb 0 --device cuda",
         "k3 run: --spine-gb is a budget of the CPU backend"},
    };
    for (size_t i = 0; i < sizeof cli / sizeof *cli; i++) {
        k3t_cli r = {0};
        if (k3t_cli_run(cli[i].args, &r)) continue;
        CHECK(r.status != 0 && strstr(r.err, cli[i].want), "k3 %s: exit %d: %s", cli[i].args,
              r.status, r.err);
        k3t_cli_free(&r);
    }
    /* a field named mid-message by the model's state-file check (k3_fail_opts), end to end */
    char path[] = "/tmp/k3-opts-XXXXXX", args[256];
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    k3t_cli r = {0};
    snprintf(args, sizeof args, "run " NANO " -q --prompt-ids 1,2,3,4,5,6 --max-new 1 "
             "--save-state %s", path);
    if (!k3t_cli_run(args, &r)) {
        CHECK(r.status == 0, "saving: %s", r.err);
        k3t_cli_free(&r);
    }
    snprintf(args, sizeof args, "run " NANO " -q --prompt-ids 7 --max-new 1 --ctx 4 "
             "--load-state %s", path);
    if (!k3t_cli_run(args, &r)) {
        CHECK(r.status == K3_ERR_INPUT && strstr(r.err, "holds 7 positions but the context is 4 "
              "(raise --ctx)"), "exit %d: %s", r.status, r.err);
        k3t_cli_free(&r);
    }
    unlink(path);
}

static void test_parse_numbers(void) {
    k3_err err = {0};
    int i = 0;
    double d = 0;
    long long ll = 0;
    uint64_t u = 0;
    CHECK(k3_parse_int("42", "--n", 1, 100, &i, &err) == 0 && i == 42, "42");
    CHECK(k3_parse_int("101", "--n", 1, 100, &i, &err) == K3_ERR_USAGE && i == 42 &&
          !strcmp(err.msg, "--n='101': expected an integer in [1, 100]"), "%s", err.msg);
    CHECK(k3_parse_int(" 5", "--n", 1, 100, &i, &err) == K3_ERR_USAGE, "leading space");
    CHECK(k3_parse_long("99999999999999999999", "X", 0, 10, &ll, &err) == K3_ERR_USAGE, "ovf");
    CHECK(k3_parse_double("2.5", "--g", 0, 3, &d, &err) == 0 && d == 2.5, "2.5");
    CHECK(k3_parse_double("1e999", "--g", 0, 1e300, &d, &err) == K3_ERR_USAGE && d == 2.5,
          "1e999 accepted");
    CHECK(k3_parse_double("", "--g", 0, 1, &d, &err) == K3_ERR_USAGE, "empty accepted");
    CHECK(k3_parse_u64("18446744073709551615", "--seed", &u, &err) == 0 &&
          u == 18446744073709551615ull, "2^64-1");
    CHECK(k3_parse_u64("-1", "--seed", &u, &err) == K3_ERR_USAGE, "-1 accepted as a seed");
}

const k3_test k3_suite_opts[] = {
    {"parse_numbers", test_parse_numbers},
    {"fields_map_to_flags", test_fields_map_to_flags},
    {"every_double_row_finite", test_every_double_row_finite},
    {"library_reads_no_environment", test_library_reads_no_environment},
    {"flag_equals_value", test_flag_equals_value},
    {"repeated_flag", test_repeated_flag},
    {"prompt_stdin_and_file", test_prompt_stdin_and_file},
    {"serve_accepts_shared_groups", test_serve_accepts_shared_groups},
    {"chat_load_state", test_chat_load_state},
    {"save_state_checked_first", test_save_state_checked_first},
    {"precedence", test_precedence},
    {"bad_values_name_range", test_bad_values_name_range},
    {"empty_api_key", test_empty_api_key},
    {"help_lists_shared_groups", test_help_lists_shared_groups},
    {"every_command_on_the_table", test_every_command_on_the_table},
    {"seed_unused_warning", test_seed_unused_warning},
    {"server_defaults", test_server_defaults},
    {"pack_out_created", test_pack_out_created},
    {0},
};
