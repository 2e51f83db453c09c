/* spine_flags.h — --spine-gb, the resident spine budget (src/model/spine.h), shared by the
 * commands that run the model on the CPU (run, chat, serve, quality, bench decode). */
#ifndef K3_CLI_SPINE_FLAGS_H
#define K3_CLI_SPINE_FLAGS_H

#include "../engine/k3.h"

typedef struct k3_cli_spine_budget {
    int set;     /* --spine-gb was given (else $K3_SPINE_GB decides) */
    double gb;   /* >= 0 */
} k3_cli_spine_budget;

/* The flag's help lines (two-space indent, 22-column flag field, as the other flags). */
extern const char k3_cli_spine_gb_help[];

/* Parses --spine-gb G at argv[*i] (advancing *i past its value). Returns 1 when consumed, 0
 * when argv[*i] is another flag, else K3_ERR_USAGE (message printed, naming cmd). */
int k3_cli_spine_gb_flag(const char *cmd, int argc, char **argv, int *i, k3_cli_spine_budget *b);
/* Copies the budget into engine options (unset: $K3_SPINE_GB, else none). */
void k3_cli_spine_gb_apply(const k3_cli_spine_budget *b, k3_engine_opts *eo);

#endif
