/* main.c — the k3 command: dispatches to subcommands. Only this layer exits. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../util/err.h"
#include "cli.h"

#define BUNDLED_MODEL "tests/fixtures/k3-tiny-kjv"

static void usage(FILE *f) {
    fprintf(f,
            "k3 — exact Kimi K3 inference on one machine\n"
            "\n"
            "usage: k3 <command> [options]\n"
            "\n"
            "commands:\n"
            "  run [MODEL_DIR] --prompt TEXT   generate text (--chat: one chat turn; k3 run --help)\n"
            "  chat [MODEL_DIR]                talk to the model (thinking, /reset, /save, ...)\n"
            "  render [DIR] --request FILE     the exact prompt an OpenAI chat request renders to\n"
            "  tokenize [DIR] TEXT             print the token ids of TEXT\n"
            "  detokenize [DIR] IDS            print the text of token ids (or --file PATH)\n"
            "  bench kernels | decode [DIR]    kernel GB/s vs memory bandwidth; s/token per layer\n"
            "  serve [MODEL_DIR] [--port N]    OpenAI-compatible HTTP server (k3 serve --help)\n"
            "  setup DEST [--full|--stream]    install a snapshot over HTTP (see k3 setup --help)\n"
            "  quality [DIR] --text FILE       NLL/perplexity and distance from the exact path\n"
            "  pack DIR [--spine int8]         write the int8 spine (not exact) beside DIR\n"
            "  synth OUT_DIR [options]         write a synthetic K3-shaped snapshot (tests)\n"
            "  replay TRACE.jsonl              expert cache policies vs Belady on a router trace\n"
            "  trace-gen OUT.jsonl [options]   synthetic router trace with K3's locality\n"
            "  bench io [MODEL_DIR]            expert-read throughput vs fio (see --help)\n"
            "  bench prefill | spec [DIR]      prefill tok/s by --chunk; --spec pass cost and gain\n"
            "  bench-gpu [MODEL_DIR]           GPU kernels and decode vs the card's bandwidth\n"
            "  version, --version              version, CPU kernel paths, CUDA compiled in or not\n"
            "\n"
            "MODEL_DIR is an unmodified Hugging Face snapshot of moonshotai/Kimi-K3; without\n"
            "it, k3 uses the small fixture model bundled in " BUNDLED_MODEL ".\n"
            "Exit status: 0 ok, 2 usage, 3 I/O, 4 config, 5 checkpoint, 6 tokenizer,\n"
            "7 bad input, 8 packed spine corrupt or from another model, 9 a routed expert\n"
            "could not be read mid-run, 12 GPU (no device, built without CUDA, CUDA error),\n"
            "130 interrupted.\n");
}

static int is_model_dir(const char *dir) {
    char p[PATH_MAX + 32];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/config.json", dir) >= (int)sizeof p) return 0;
    return stat(p, &st) == 0;
}

const char *k3_default_model_dir(void) {
    static char buf[PATH_MAX + 64]; /* CLI-only; written before any thread starts */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            if (snprintf(buf, sizeof buf, "%s/" BUNDLED_MODEL, exe) < (int)sizeof buf &&
                is_model_dir(buf))
                return buf;
            if (snprintf(buf, sizeof buf, "%s/../" BUNDLED_MODEL, exe) < (int)sizeof buf &&
                is_model_dir(buf)) /* build/k3 */
                return buf;
        }
    }
    if (!is_model_dir(BUNDLED_MODEL))
        fprintf(stderr, "k3: no MODEL_DIR given, and the bundled fixture model (%s) is neither "
                "beside this k3 (%s) nor under the current folder: give a model folder (a "
                "Hugging Face snapshot of moonshotai/Kimi-K3) as the first argument, e.g. "
                "k3 run /path/to/Kimi-K3 --prompt TEXT\n", BUNDLED_MODEL,
                n > 0 ? exe : "its folder is unknown");
    return BUNDLED_MODEL;
}

/* Edit distance of a and b, capped at 3 (enough to spot a typo). */
static int distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 32 || lb > 32 || (la > lb ? la - lb : lb - la) > 2) return 3;
    int d[33][33];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]), del = d[i - 1][j] + 1,
                ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb] < 3 ? d[la][lb] : 3;
}

/* One line on stderr: what was not understood, the closest command when it looks like a typo,
 * and where the list is. */
static void unknown_command(const char *cmd) {
    static const char *const names[] = {"run", "chat", "render", "tokenize", "detokenize",
        "serve", "setup", "quality", "pack", "synth", "replay", "trace-gen", "bench",
        "bench-gpu", "version", "help"};
    const char *best = NULL, *word = cmd + strspn(cmd, "-"); /* --verison: version */
    int best_d = 3;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int d = distance(word, names[i]);
        if (d < best_d) best_d = d, best = names[i];
    }
    fprintf(stderr, "k3: unknown command '%s'%s%s%s; k3 --help lists the commands\n", cmd,
            best ? " (did you mean '" : "", best ? best : "", best ? "'?)" : "");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return K3_ERR_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version"))
        return k3_cmd_version(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return k3_cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return k3_cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "render")) return k3_cmd_render(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return k3_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "detokenize")) return k3_cmd_detokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return k3_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "setup")) return k3_cmd_setup(argc - 1, argv + 1);
    if (!strcmp(cmd, "quality")) return k3_cmd_quality(argc - 1, argv + 1);
    if (!strcmp(cmd, "pack")) return k3_cmd_pack(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return k3_cmd_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "replay")) return k3_cmd_replay(argc - 1, argv + 1);
    if (!strcmp(cmd, "trace-gen")) return k3_cmd_tracegen(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench") && argc > 2 &&
        (!strcmp(argv[2], "kernels") || !strcmp(argv[2], "decode")))
        return k3_cmd_bench_compute(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench") && argc > 2 &&
        (!strcmp(argv[2], "prefill") || !strcmp(argv[2], "spec")))
        return k3_cmd_bench_batch(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return k3_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench-gpu")) return k3_cmd_bench_gpu(argc - 1, argv + 1);
    unknown_command(cmd);
    return K3_ERR_USAGE;
}
