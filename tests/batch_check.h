/* batch_check.h — checks of the batched forward pass shared by the k3-nano and k3-wide suites
 * (tests/test_prefill.c, tests/test_prefillwide.c) and the speculative decoding tests. */
#ifndef K3_BATCH_CHECK_H
#define K3_BATCH_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "../src/engine/k3.h"

/* One reference prompt (tests/fixtures/README.md): its ids, the reference logits at every
 * position [n][vocab] and the 24-token greedy continuation. */
typedef struct bc_prompt {
    int32_t *ids;
    int n, vocab;
    float *logits;
    int32_t greedy[64];
    int n_greedy;
    int max_greedy; /* how many of them bc_check_chunked checks */
} bc_prompt;

/* Loads ref_dir/name; 0 after recording a test failure. */
int bc_prompt_load(const char *ref_dir, const char *name, bc_prompt *p);
void bc_prompt_free(bc_prompt *p);
/* The prompt files listed in ref_dir/manifest.json ("prompts"); returns how many (<= cap),
 * names malloc'd into names[]. */
int bc_prompt_names(const char *ref_dir, char **names, int cap);

/* For every reference prompt and every chunk size: the chunked prefill (k3_session_forward
 * passes of `chunk` ids with logits at every position) must give logits, routing and state
 * file BIT-IDENTICAL to feeding the ids one by one with k3_session_step, logits within tol of
 * the reference with the same argmax, the same last-position logits through
 * k3_session_prefill with that chunk, and the first max_greedy tokens of the reference greedy
 * continuation. max_greedy 0 (the quick form for k3-wide) checks logits, routing and state
 * only. */
void bc_check_chunked(const char *model_dir, const char *ref_dir, const int *chunks,
                      int n_chunks, double tol, int max_greedy);

/* A temporary file path (unique per call) for state files. */
void bc_tmp_path(char *buf, size_t cap, const char *tag);
/* 1 when the two files hold the same bytes. */
int bc_same_file(const char *a, const char *b);

#endif
