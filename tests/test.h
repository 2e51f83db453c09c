/* test.h — the project's tiny test harness.
 *
 * Each tests/test_*.c file defines static test functions and one exported, NULL-terminated
 * suite table; tests/test_main.c lists the suites. A test fails on its first CHECK that does
 * not hold. Tests run from the repository root, so fixture paths are "tests/fixtures/...".
 *
 *   static void test_rmsnorm(void) { CHECK(fabsf(y - 1.0f) < 1e-6f, "y=%g", y); }
 *   const k3_test k3_suite_kernels[] = {{"rmsnorm", test_rmsnorm}, {0}};
 */
#ifndef K3_TEST_H
#define K3_TEST_H

#include <stdio.h>

typedef struct k3_test {
    const char *name;
    void (*fn)(void);
} k3_test;

/* Records a failure of the running test (first one wins). */
void k3_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Marks the running test as skipped with a reason (printed as SKIPPED, not counted as pass). */
void k3_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Nonzero once the running test has failed or skipped: a helper's caller returns early. */
int k3_test_stopped(void);

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            k3_test_fail(__FILE__, __LINE__, "CHECK(" #cond ") " __VA_ARGS__);            \
            return;                                                                       \
        }                                                                                 \
    } while (0)

/* Like CHECK for helpers that return a value on failure. */
#define CHECK_OR(ret, cond, ...)                                                          \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            k3_test_fail(__FILE__, __LINE__, "CHECK(" #cond ") " __VA_ARGS__);            \
            return ret;                                                                   \
        }                                                                                 \
    } while (0)

#endif
