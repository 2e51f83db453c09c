/* store_flags.h — the expert-store flags shared by k3 run and k3 chat (--expert-gb,
 * --load-threads, --direct, --pipe, --cache-policy, --dirs, --expert-disk-gb, --mmap-experts,
 * --profile, --router-trace), and what they install on a session: the router trace, the
 * per-token profile line and the end-of-run summary. */
#ifndef K3_CLI_STORE_FLAGS_H
#define K3_CLI_STORE_FLAGS_H

#include <stdio.h>
#include "../engine/k3.h"

typedef struct k3_cli_store_opts {
    double expert_gb;
    double expert_disk_gb;     /* --expert-disk-gb, when expert_disk_budget */
    int expert_disk_budget;
    int load_threads, direct, pipe, mmap_experts, profile;
    const char *cache_policy, *dirs, *router_trace;
} k3_cli_store_opts;

/* What a run holds while the flags are in effect. */
typedef struct k3_cli_store_run {
    const k3_cli_store_opts *o;
    k3_session *s;
    FILE *trace;        /* --router-trace, or NULL */
    int profile;        /* lines per step: 0 none, 1 one line (K3_PROFILE=1 or --profile),
                         * 2 also one per-layer line (K3_PROFILE=2) */
} k3_cli_store_run;

/* Parses the store flag at argv[*i] (advancing *i past its value). Returns 1 when consumed,
 * 0 when argv[*i] is not a store flag, else K3_ERR_USAGE (message printed, naming cmd). */
int k3_cli_store_flag(const char *cmd, int argc, char **argv, int *i, k3_cli_store_opts *o);
/* The flags' help lines. */
void k3_cli_store_usage(FILE *f);
/* Copies the flags into engine options (unset flags leave the K3_* environment in charge). */
void k3_cli_store_engine_opts(const k3_cli_store_opts *o, k3_engine_opts *eo);
/* Opens the router trace and installs the trace hook on s. Errors: K3_ERR_IO (trace file). */
int k3_cli_store_attach(k3_cli_store_run *r, k3_session *s, const k3_cli_store_opts *o,
                        k3_err *err);
/* Prints the end-of-run summary (when verbose) and closes the trace. */
void k3_cli_store_finish(k3_cli_store_run *r, int verbose);

#endif
