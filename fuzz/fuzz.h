/* fuzz.h — the fuzz harnesses' shared entry points (fuzz/README.md).
 *
 * Each fuzz/fuzz_NAME.c defines k3_fuzz_NAME(data, size): it feeds the bytes to one of k3's
 * parsers, checks an oracle where one exists, and returns 0, or -1 when the oracle failed
 * (crashes and sanitizer reports speak for themselves). Built with -DK3_FUZZ_LIBFUZZER, the
 * file also defines libFuzzer's LLVMFuzzerTestOneInput, which aborts on -1; without it,
 * tests/test_fuzzregress.c includes the harnesses and feeds them every fuzz/regress/NAME/
 * file, so each input that once crashed stays a test of `make test`.
 *
 * Harnesses may keep loaded fixtures (a tokenizer) in static variables: they live for the
 * process, as libFuzzer runs one harness per process.
 */
#ifndef K3_FUZZ_H
#define K3_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef K3_FUZZ_LIBFUZZER
#define K3_FUZZ_ENTRY(fn)                                                                 \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);                        \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {                       \
        if (fn(data, size)) {                                                             \
            fprintf(stderr, "%s: oracle failed\n", #fn);                                  \
            abort();                                                                      \
        }                                                                                 \
        return 0;                                                                         \
    }
#else
#define K3_FUZZ_ENTRY(fn)
#endif

/* Directory for harnesses that must hand their input to a file-based reader: tmpfs when
 * there is one. */
static inline const char *k3_fuzz_tmpdir(void) {
    const char *d = getenv("K3_FUZZ_TMP");
    return d ? d : "/dev/shm";
}

#endif
