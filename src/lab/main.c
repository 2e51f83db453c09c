/* main.c — k3-lab, the developer binary beside k3 over the same library: benchmarks and
 * test-data tools. One table for usage, typo hint and dispatch (src/cli/cmdtable.h). */
#include "../cli/cli.h"
#include "../cli/cmdtable.h"
#include "../cli/model_dir.h"
#include "lab.h"

static const k3_command commands[] = {
    {"bench", "kernels decode", k3_cmd_bench_compute, "bench kernels | decode [DIR]",
     "kernel GB/s vs memory bandwidth; s/token per layer", NULL, 1},
    {"bench", "prefill spec", k3_cmd_bench_batch, "bench prefill | spec [DIR]",
     "prefill tok/s by --chunk; --spec pass cost and gain", NULL, 1},
    {"bench", "mla", k3_cmd_bench_mla, "bench mla [DIR]",
     "MLA attention per token vs context, beside its floor", NULL, 1},
    {"bench", NULL, k3_cmd_bench, "bench io [MODEL_DIR]",
     "expert-read throughput vs fio (see --help)", NULL, 1},
    {"bench-batch", NULL, k3_cmd_bench_multi, "bench-batch [MODEL_DIR] [--sessions 1,2,4,8]",
     "N sessions in one pass vs one after another: tok/s, bytes/token", NULL, 1},
    {"bench-gpu", NULL, k3_cmd_bench_gpu, "bench-gpu [MODEL_DIR]",
     "GPU kernels and decode vs the card's bandwidth", NULL, 1},
    {"synth", NULL, k3_cmd_synth, "synth OUT_DIR [options]",
     "write a synthetic K3-shaped snapshot (tests)", NULL, 0},
    {"replay", NULL, k3_cmd_replay, "replay TRACE.jsonl",
     "expert cache policies vs Belady on a router trace", NULL, 0},
    {"trace-gen", NULL, k3_cmd_tracegen, "trace-gen OUT.jsonl [options]",
     "synthetic router trace with K3's locality", NULL, 0},
    {"version", NULL, k3_cmd_version, "version, --version",
     "version, CPU kernel paths, CUDA compiled in or not", NULL, 0},
    {"--version", NULL, k3_cmd_version, NULL, NULL, NULL, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};

static const k3_program lab_prog = {
    "k3-lab", "k3-lab — the k3 developer tools: benchmarks, synthetic snapshots, router traces",
    "DIR / MODEL_DIR default to the fixture model bundled in " K3_BUNDLED_MODEL "; a\n"
    "model's name works too, OWNER/NAME or OWNER/NAME@REV, found as k3 finds it (k3 --help).\n"
    "The commands users run (run, chat, serve, setup, ...) are in k3 (k3 --help).\n"
    "Exit status: as k3's (0 ok, 2 usage, 3 I/O, 4 config, 5 checkpoint, ...; k3 --help).\n",
    commands,
};

int main(int argc, char **argv) {
    return k3_program_main(&lab_prog, argc, argv);
}
