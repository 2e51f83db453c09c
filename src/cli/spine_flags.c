/* spine_flags.c — see spine_flags.h. */
#include "spine_flags.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char k3_cli_spine_gb_help[] =
    "  --spine-gb G         RAM for the spine in GB (K3_SPINE_GB; CPU only; 0 <= G < 1e9):\n"
    "                       lm_head and the first layers that fit stay resident, the rest are\n"
    "                       read from the shards half a layer at a time while the previous\n"
    "                       half computes (two staging buffers, counted in G; O_DIRECT reads,\n"
    "                       buffered ones with K3_DIRECT=0, or --direct 0 in k3 run and chat);\n"
    "                       0 streams every layer. Output is identical for every G; the load\n"
    "                       line prints the plan. Default: everything used in place from the\n"
    "                       mapped files\n";

int k3_cli_spine_gb_flag(const char *cmd, int argc, char **argv, int *i, k3_cli_spine_budget *b) {
    if (strcmp(argv[*i], "--spine-gb")) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "k3 %s: --spine-gb needs a value\n", cmd);
        return K3_ERR_USAGE;
    }
    const char *v = argv[++*i];
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || end == v || !(x >= 0 && x < 1e9)) {
        fprintf(stderr, "k3 %s: --spine-gb needs a number of GB >= 0 (and below 1e9), got "
                "'%s'\n", cmd, v);
        return K3_ERR_USAGE;
    }
    b->set = 1;
    b->gb = x;
    return 1;
}

void k3_cli_spine_gb_apply(const k3_cli_spine_budget *b, k3_engine_opts *eo) {
    eo->spine_budget = b->set;
    eo->spine_gb = b->gb;
}
