/* opts.h — the option table: every flag of every k3 and k3-lab command, in one place.
 * One row per option: its flag, its environment variable (if any), type and range, default,
 * help text and the field it sets (a k3_engine_opts field, a field of the generation and chat
 * options of gen.h, a CLI-level field of k3_cli_common, or a field of the command's own
 * struct). Commands draw the shared groups (device, threads, kernels, spine, expert store,
 * speed, sampling, chat, context, state) and add rows of their own; --help is printed from
 * the same rows, so help and behaviour cannot disagree. No command parses argv by hand: k3's
 * commands (src/cli) and k3-lab's (src/lab, the only other layer that may include this
 * header) all go through k3_opts_parse.
 *
 * Invariants:
 *  - Precedence: flag, then the row's variable (set and non-empty), then the row's default
 *    (def, parsed by the same code as the flag), then the target's initial value.
 *  - Flag and variable accept the same spellings (--pipe prev and K3_PIPE=prev).
 *  - --flag VALUE and --flag=VALUE are the same; a flag given twice is an error (exit 2
 *    naming it); numbers are range-checked (finite doubles only) and the message states the
 *    range; the variable is named when its value is bad.
 *  - This file and opts.c are the only readers of the environment for these options; the
 *    library below src/cli reads none (k3_engine_opts holds explicit values).
 */
#ifndef K3_CLI_OPTS_H
#define K3_CLI_OPTS_H

#include <stddef.h>
#include <stdio.h>

#include "../engine/k3.h"
#include "gen.h"

/* CLI-level fields shared by several commands (not engine options). */
typedef struct k3_cli_common {
    int quiet;                 /* -q: no load line, no summary */
    int ctx;                   /* --ctx N: context capacity (0 = the engine default) */
    const char *save_state, *load_state; /* --save-state / --load-state FILE */
    const char *router_trace;  /* --router-trace PATH */
    int profile;               /* --profile / K3_PROFILE: 0, 1 (one line per pass), 2 (+ layers) */
    const char *hf_token;      /* HF_TOKEN: a streaming install's downloads */
    double expert_disk_gb;     /* --expert-disk-gb: a streaming install's fetched experts on
                                  disk, GB; < 0: leave a margin of the file system free */
    double mpi_timeout;        /* --mpi-timeout / K3_MPI_TIMEOUT: seconds an MPI rank waits for
                                  another (make MPI=1; src/dist/dist.h) */
} k3_cli_common;

/* Where a row writes. */
enum k3_opt_target { K3_OT_ENGINE, K3_OT_GEN, K3_OT_COMMON, K3_OT_CMD };

enum k3_opt_type {
    K3_OPT_SWITCH, /* no value: stores `value` (int or bool field, by size); the variable
                    * takes an integer in [lo, hi] */
    K3_OPT_INT,    /* int in [lo, hi] */
    K3_OPT_SIZE,   /* size_t in [lo, hi] */
    K3_OPT_U64,    /* uint64_t, any; also sets `value`'s bool: the seed's has_seed */
    K3_OPT_DOUBLE, /* finite double in [lo, hi] (or (lo, hi] with K3_OPTF_LO_OPEN) */
    K3_OPT_STR,    /* const char * (argv or the environment; never copied) */
    K3_OPT_WORD,   /* const char *, one of `choices` names */
    K3_OPT_CHOICE, /* int: the value of the matching `choices` name */
};

enum {
    K3_OPTF_LO_OPEN = 1,
    K3_OPTF_NONEMPTY = 2,
    K3_OPTF_LAB = 4,
    K3_OPTF_HIDDEN = 8, /* parsed but not listed in --help: a sibling command's flag, which the
                         * command refuses after parsing with a pointer to the sibling */
};

#define K3_XSTR(x) #x
#define K3_STR(x) K3_XSTR(x) /* a macro's value in a help string: K3_STR(K3_MAX_CHUNK) */

typedef struct k3_opt_choice {
    const char *name;
    int value;
} k3_opt_choice;

/* Groups of shared rows. */
enum {
    K3_OG_DEVICE = 1 << 0,   /* --device, --gpu-gb */
    K3_OG_THREADS = 1 << 1,  /* --threads (the one row every command's threads come from) */
    K3_OG_SPINE = 1 << 2,    /* --spine, --approx */
    K3_OG_BUDGET = 1 << 3,   /* --pack-dir, --spine-gb */
    K3_OG_STORE = 1 << 4,    /* --expert-gb ... --router-trace */
    K3_OG_SPEED = 1 << 5,    /* --chunk, --spec */
    K3_OG_SAMPLING = 1 << 6, /* --temperature, --top-k, --top-p, --seed */
    K3_OG_CHAT = 1 << 7,     /* --system, --effort, --think, --no-think, --no-show-thinking */
    K3_OG_CTX = 1 << 8,      /* --ctx */
    K3_OG_STATE = 1 << 9,    /* --load-state, --save-state */
    K3_OG_NET = 1 << 10,     /* HF_TOKEN (variable only) */
    K3_OG_QUIET = 1 << 11,   /* -q, --quiet */
    K3_OG_TRACE = 1 << 12,   /* --profile, --router-trace (run, chat) */
    K3_OG_KERNELS = 1 << 13, /* --kernels */
    K3_OG_MODEL = K3_OG_DEVICE | K3_OG_THREADS | K3_OG_KERNELS | K3_OG_SPINE | K3_OG_BUDGET |
                  K3_OG_STORE | K3_OG_NET | K3_OG_QUIET, /* every command that loads a model for
                                                          * generation */
};

typedef struct k3_opt {
    const char *flag;        /* "--expert-gb"; NULL: a variable only */
    const char *alias;       /* "-q", or NULL */
    const char *env;         /* "K3_EXPERT_GB", or NULL */
    const char *field;       /* the field it sets: "expert_gb" (library errors name it) */
    enum k3_opt_target target;
    enum k3_opt_type type;
    size_t offset, size;     /* the field in its target */
    double lo, hi;           /* numbers' range */
    int flags;               /* K3_OPTF_* */
    int value;               /* K3_OPT_SWITCH: the value stored */
    const k3_opt_choice *choices; /* K3_OPT_WORD / K3_OPT_CHOICE: {NULL, 0}-terminated */
    const char *def;         /* the default as a value (parsed like the flag), or NULL */
    const char *meta;        /* "GB" in "--expert-gb GB"; NULL for a switch */
    const char *help;        /* '\n' starts a continuation line */
    unsigned group;          /* K3_OG_*; 0 for command rows */
} k3_opt;

/* Row helpers: where a field is (target, offset, size). */
#define K3_OPT_AT(T, type, f) .target = T, .offset = offsetof(type, f), .size = sizeof(((type *)0)->f)
#define K3_OPT_ENG(f) K3_OPT_AT(K3_OT_ENGINE, k3_engine_opts, f), .field = #f
#define K3_OPT_GEN(f) K3_OPT_AT(K3_OT_GEN, k3_cli_chat_opts, f)
#define K3_OPT_COM(f) K3_OPT_AT(K3_OT_COMMON, k3_cli_common, f)
#define K3_OPT_CMD(type, f) K3_OPT_AT(K3_OT_CMD, type, f)

/* A command's options: its own rows and the shared groups it draws. */
typedef struct k3_cli_command {
    const char *name;        /* "run": messages say "k3 run: ..." */
    const char *prog;        /* "k3-lab" for the lab's commands; NULL = "k3" */
    const char *usage;       /* printed first by --help (usage line and description) */
    const k3_opt *rows;      /* the command's own rows (any target) */
    size_t n_rows;
    unsigned groups;         /* K3_OG_* */
    const char *epilog;      /* printed last by --help, or NULL */
    int max_positional;      /* MODEL_DIR and the like */
    int end_of_options;      /* 1: "--" ends the options (what follows is positional) */
} k3_cli_command;

/* Where the targets are (NULL for targets the command does not use). */
typedef struct k3_opt_targets {
    k3_engine_opts *eo;
    k3_cli_chat_opts *co;
    k3_cli_common *cc;
    void *cmd;
} k3_opt_targets;

/* The parse result. */
typedef struct k3_opts_parsed {
    const char *positional[4];
    int n_positional;
    unsigned char given[160]; /* given[i]: row i (command rows first, then the table's) was
                               * set by its flag (1) or its variable (2) */
} k3_opts_parsed;

/* Fills the targets for cmd from argv[1..argc): first the CLI defaults (*eo =
 * k3_engine_opts_default() but spine auto, device auto and, while --threads is not given,
 * OpenMP's own count when OMP_NUM_THREADS is set; *co = K3_CLI_CHAT_DEFAULTS; *cc zeroed;
 * the command struct as the caller initialised it), then each row's def, variable and flag.
 * Returns K3_OK; -1 after printing --help to stdout (exit 0); K3_ERR_USAGE after printing
 * "k3 CMD: ..." to stderr. */
int k3_opts_parse(const k3_cli_command *cmd, int argc, char **argv, const k3_opt_targets *t,
                  k3_opts_parsed *out);

/* 1 when the row for flag was given by its flag, 2 by its variable, else 0. */
int k3_opts_given(const k3_cli_command *cmd, const k3_opts_parsed *p, const char *flag);

/* Prints "PROG CMD: WHAT (see PROG CMD --help)" to stderr (a rule the rows cannot state: a
 * missing positional, two modes at once); returns K3_ERR_USAGE. */
int k3_opts_usage_error(const k3_cli_command *cmd, const char *what);

/* The help of cmd: its usage, its rows, then each shared group it draws. */
void k3_opts_usage(const k3_cli_command *cmd, FILE *f);

/* Writes a library error's message to out (cap bytes, always terminated), with the flag of
 * the table row that sets each option field the message names (err->field, recorded by
 * k3_fail_field / k3_fail_opts with its offset) standing where the field's name stood:
 * "spine_gb 2e+06: ..." becomes "--spine-gb 2e+06: ...", "(raise ctx)" "(raise --ctx)". A
 * field no row sets stays as it is. Nothing is searched in the text. Returns out. */
const char *k3_opts_render(const k3_err *err, char *out, size_t cap);

/* Prints a library error as "k3 CMD: MSG\n" to stderr, MSG rendered by k3_opts_render. An
 * empty message is not printed (an MPI follower rank: rank 0 reports). */
void k3_opts_error(const char *cmd, const k3_err *err);

/* The flag of the table row that sets field (a k3_engine_opts or k3_cli_common field), or
 * NULL. */
const char *k3_opts_flag_of(const char *field);

/* The shared table (for tests and `k3 version`): rows and count. */
const k3_opt *k3_opts_table(size_t *n);


#endif
