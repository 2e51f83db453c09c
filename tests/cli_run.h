/* cli_run.h — helpers for tests that run the k3 binary ($K3_BIN, default ./k3), the developer
 * binary k3-lab ($K3_LAB_BIN, default ./k3-lab) or need a scratch copy of the k3-nano fixture.
 * Every helper records a test failure (test.h) and returns -1 / NULL when something it needs
 * cannot be done. */
#ifndef K3_TEST_CLI_RUN_H
#define K3_TEST_CLI_RUN_H

#include <stddef.h>
#include <stdint.h>

typedef struct k3t_cli {
    int status;      /* exit status; -1 when killed by a signal */
    char *out, *err; /* everything written to stdout / stderr, NUL-terminated */
} k3t_cli;

/* The k3 binary: $K3_BIN, else ./k3. */
const char *k3t_bin(void);
/* The developer binary (bench, synth, replay, trace-gen, bench-gpu): $K3_LAB_BIN, else
 * ./k3-lab. */
const char *k3t_lab_bin(void);

/* Runs `cd CWD && BIN ARGS` through /bin/sh (ARGS is shell text; cwd NULL = stay here, bin
 * NULL = k3t_bin() made absolute) with stdin from /dev/null, capturing stdout and stderr. */
int k3t_cli_run_in(const char *cwd, const char *bin, const char *args, k3t_cli *r);
/* k3t_cli_run_in(NULL, NULL, args, r). */
int k3t_cli_run(const char *args, k3t_cli *r);
/* The same with k3t_lab_bin() made absolute. */
int k3t_lab_run(const char *args, k3t_cli *r);
void k3t_cli_free(k3t_cli *r);

/* A new /tmp folder (malloc'd path); k3t_rm_dir removes it and everything in it, then frees
 * the path (NULL is ignored). */
char *k3t_tmpdir(void);
void k3t_rm_dir(char *dir);
/* A fresh copy of tests/fixtures/k3-nano's files (not reference/) in a new /tmp folder. */
char *k3t_nano_copy(void);

/* Overwrites element `index` of the BF16 tensor `name` in the snapshot in dir with `bits`
 * (e.g. 0x7fc0 NaN, 0x7f80 +Inf), in place in its shard file. */
int k3t_patch_bf16(const char *dir, const char *name, size_t index, uint16_t bits);

#endif
