/* cmdtable.h — the command table of a k3 program (k3, k3-lab): one row per command drives the
 * usage text, the "did you mean" hint and dispatch, so the three cannot disagree.
 *
 * Invariants: rows are matched in order, so a row with `subs` (e.g. `bench kernels|decode`)
 * comes before the catch-all row of the same name; a row with `moved_to` and no `run` is a
 * command that lives in the other binary: it is never listed, dispatching to it says where it
 * went (exit 2), and the typo hint names it with that binary. */
#ifndef K3_CLI_CMDTABLE_H
#define K3_CLI_CMDTABLE_H

#include <stdio.h>

typedef struct k3_command {
    const char *name;     /* argv[1], e.g. "run", "bench" */
    const char *subs;     /* NULL, or the argv[2] words this row takes, space-separated
                           * ("kernels decode"); the row's function then gets argv + 2 */
    int (*run)(int argc, char **argv); /* argv[0] is the command (or sub) name; returns the
                                        * exit status; NULL for a moved command */
    const char *synopsis; /* the usage line's left column ("run [MODEL_DIR] --prompt TEXT");
                           * NULL: not listed (an alias row) */
    const char *help;     /* its one-line description */
    const char *moved_to; /* NULL, or the program that has the command now ("k3-lab") */
    int threads;          /* 1: runs the model's OpenMP work, so the wait policy is applied
                           * first (waitpolicy.h: it re-executes the process once) */
} k3_command;

typedef struct k3_program {
    const char *name;         /* "k3", "k3-lab": the prefix of every message */
    const char *title;        /* the first usage line */
    const char *epilogue;     /* usage text after the command list (ends with "\n") */
    const k3_command *cmds;   /* ends with a row whose name is NULL */
} k3_program;

/* The usage text: title, "usage: NAME <command> [options]", every listed row, epilogue. */
void k3_program_usage(const k3_program *p, FILE *f);

/* Runs the command argv[1] names: -h/--help/help print the usage (stdout, 0); no command
 * prints it to stderr (exit 2); a moved command says which program has it now (exit 2); an
 * unknown one gets one line on stderr with the closest name when it looks like a typo (exit
 * 2). Otherwise returns the command's own exit status; argv is main's (a row with `threads`
 * may re-execute it, see waitpolicy.h). */
int k3_program_main(const k3_program *p, int argc, char **argv);

#endif
