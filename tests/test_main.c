/* test_main.c — runs every suite (or those named on the command line) and prints
 * "N passed, N failed" (plus skipped) as its last line. Exit status 1 when anything failed. */
#include "test.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

extern const k3_test k3_suite_util[];
extern const k3_test k3_suite_model[];
extern const k3_test k3_suite_tokenizer[];
extern const k3_test k3_suite_kernels[];
extern const k3_test k3_suite_badinput[];
#define SUITES X(util) X(tokenizer) X(kernels) X(model) X(badinput)

#define X(name) {#name, k3_suite_##name},
static const struct {
    const char *name;
    const k3_test *tests;
} suites[] = {SUITES};
#undef X

static int cur_failed, cur_skipped;
static char cur_msg[2048];

void k3_test_fail(const char *file, int line, const char *fmt, ...) {
    if (cur_failed || cur_skipped) return;
    cur_failed = 1;
    int n = snprintf(cur_msg, sizeof cur_msg, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cur_msg + n, sizeof cur_msg - (size_t)n, fmt, ap);
    va_end(ap);
}

void k3_test_skip(const char *fmt, ...) {
    if (cur_failed || cur_skipped) return;
    cur_skipped = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cur_msg, sizeof cur_msg, fmt, ap);
    va_end(ap);
}

int k3_test_stopped(void) { return cur_failed || cur_skipped; }

static int selected(const char *suite, int argc, char **argv) {
    if (argc <= 1) return strcmp(suite, "wide") != 0; /* wide runs only when asked for */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], suite) == 0) return 1;
    return 0;
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    for (size_t s = 0; s < sizeof suites / sizeof suites[0]; s++) {
        if (!selected(suites[s].name, argc, argv)) continue;
        for (const k3_test *t = suites[s].tests; t->name; t++) {
            cur_failed = cur_skipped = 0;
            cur_msg[0] = 0;
            t->fn();
            if (cur_failed) {
                failed++;
                printf("FAIL    %s/%s: %s\n", suites[s].name, t->name, cur_msg);
            } else if (cur_skipped) {
                skipped++;
                printf("SKIPPED %s/%s: %s\n", suites[s].name, t->name, cur_msg);
            } else {
                passed++;
                printf("ok      %s/%s\n", suites[s].name, t->name);
            }
            fflush(stdout);
        }
    }
    if (skipped) printf("%d skipped\n", skipped);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
