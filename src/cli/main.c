/* main.c — the k3 command: the commands users run, one table for usage, typo hint and
 * dispatch (cmdtable.h). The developer tools (bench*, synth, replay, trace-gen, bench-gpu)
 * are the separate k3-lab binary (src/lab). Only this layer exits. */
#include "cli.h"
#include "cmdtable.h"
#include "load.h"
#include "model_dir.h"

#define LAB "k3-lab"

static const k3_command commands[] = {
    {"run", NULL, k3_cmd_run, "run [MODEL_DIR] --prompt TEXT",
     "generate text (--chat: one chat turn; k3 run --help)", NULL, 1},
    {"chat", NULL, k3_cmd_chat, "chat [MODEL_DIR]", "talk to the model (thinking, /reset, "
     "/save, ...)", NULL, 1},
    {"render", NULL, k3_cmd_render, "render [DIR] --request FILE",
     "the exact prompt an OpenAI chat request renders to", NULL, 0},
    {"tokenize", NULL, k3_cmd_tokenize, "tokenize [DIR] TEXT", "print the token ids of TEXT",
     NULL, 0},
    {"detokenize", NULL, k3_cmd_detokenize, "detokenize [DIR] IDS",
     "print the text of token ids (or --file PATH)", NULL, 0},
    {"serve", NULL, k3_cmd_serve, "serve [MODEL_DIR] [--port N]",
     "OpenAI-compatible HTTP server (k3 serve --help)", NULL, 1},
    {"setup", NULL, k3_cmd_setup, "setup [DEST] [--full|--stream]",
     "install a snapshot over HTTP (see k3 setup --help)", NULL, 0},
    {"quality", NULL, k3_cmd_quality, "quality [DIR] --text FILE",
     "NLL/perplexity and distance from the exact path", NULL, 1},
    {"pack", NULL, k3_cmd_pack, "pack DIR [--spine int8]",
     "write the int8 spine (not exact) beside DIR", NULL, 1},
    {"plan", NULL, k3_cmd_plan, "plan [MODEL_DIR] [--memory-gb G]",
     "the memory plan k3 run makes, without reading a weight", NULL, 0},
    {"version", NULL, k3_cmd_version, "version, --version",
     "version, CPU kernel paths, CUDA compiled in or not", NULL, 0},
    {"--version", NULL, k3_cmd_version, NULL, NULL, NULL, 0},
    /* the developer tools: `k3 bench ...` says where they went instead of "unknown" */
    {"bench", NULL, NULL, NULL, NULL, LAB, 0},
    {"bench-gpu", NULL, NULL, NULL, NULL, LAB, 0},
    {"synth", NULL, NULL, NULL, NULL, LAB, 0},
    {"replay", NULL, NULL, NULL, NULL, LAB, 0},
    {"trace-gen", NULL, NULL, NULL, NULL, LAB, 0},
    {NULL, NULL, NULL, NULL, NULL, NULL, 0},
};

static const k3_program k3_prog = {
    "k3", "k3 — exact Kimi K3 inference on one machine",
    "MODEL_DIR is an unmodified Hugging Face snapshot of moonshotai/Kimi-K3, or its\n"
    "name (OWNER/NAME): the newest complete snapshot in the Hugging Face cache\n"
    "($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub), else the folder k3 setup\n"
    "installs into ($K3_MODELS/OWNER/NAME; k3 setup --help). OWNER/NAME@REV pins a\n"
    "revision: a branch or tag (main, refs/pr/1) or a commit (7 or more hex digits), that\n"
    "one or an error, never another. Without it, k3 uses the\n"
    "small fixture model bundled in " K3_BUNDLED_MODEL "\n"
    "(installed: PREFIX/share/k3/k3-tiny-kjv).\n"
    "Benchmarks and test-data tools are in the developer binary " LAB " (" LAB " --help).\n"
    "Exit status: 0 ok, 2 usage, 3 I/O, 4 config, 5 checkpoint, 6 tokenizer,\n"
    "7 bad input, 8 packed spine corrupt or from another model, 9 a routed expert\n"
    "could not be read mid-run, 12 GPU (no device, built without CUDA, CUDA error),\n"
    "13 a rank of an MPI run failed or did not answer (make MPI=1),\n"
    "130 interrupted.\n",
    commands,
};

int main(int argc, char **argv) {
    int rc = k3_program_main(&k3_prog, argc, argv);
    return rc == K3_CLI_FOLLOWED ? 0 : rc; /* an MPI follower rank: rank 0 ran the command */
}
