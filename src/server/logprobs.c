/* logprobs.c — log probabilities for the OpenAI logprobs fields (see srv.h, k3_logprobs).
 *
 * A value is log_softmax of the exact float32 logits the model gave at that position
 * (computed in double: max, then the sum of exp(l - max)). It describes the MODEL's
 * distribution, not the sampler's: temperature, top-p and top-k are not applied. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../tok/utf8.h"
#include "srv.h"

#define K3_TOP_LOGPROBS_MAX 20

/* log(sum(exp(logits))) over the vocabulary. */
static double log_norm(const float *l, int vocab) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < vocab; i++)
        if (l[i] > m) m = l[i];
    for (int i = 0; i < vocab; i++) s += exp((double)l[i] - m);
    return m + log(s);
}

/* The `top` ids with the largest logits, largest first (ties: lower id first). */
static int top_ids(const float *l, int vocab, int top, int32_t *ids) {
    int n = 0;
    if (top <= 0) return 0;
    for (int i = 0; i < vocab; i++) {
        if (n == top && l[i] <= l[ids[n - 1]]) continue;
        int k = n < top ? n++ : n - 1;
        while (k > 0 && l[ids[k - 1]] < l[i]) {
            ids[k] = ids[k - 1];
            k--;
        }
        ids[k] = i;
    }
    return n;
}

/* The token's text as OpenAI writes it: its bytes when they are UTF-8, else "bytes:\xNN…". */
static void token_str(k3_sbuf *b, const k3_tokenizer *t, int32_t id) {
    size_t len = 0;
    const char *s = k3_tokenizer_token_bytes(t, id, &len);
    if (!s) len = 0;
    k3_sbuf_str(b, "\"");
    if (k3_utf8_invalid_at((const unsigned char *)s, len) == len) {
        k3_sbuf_json_str(b, s, len);
    } else {
        k3_sbuf_str(b, "bytes:");
        for (size_t i = 0; i < len; i++) k3_sbuf_printf(b, "\\\\x%02x", (unsigned char)s[i]);
    }
    k3_sbuf_str(b, "\"");
}

static void token_bytes(k3_sbuf *b, const k3_tokenizer *t, int32_t id) {
    size_t len = 0;
    const char *s = k3_tokenizer_token_bytes(t, id, &len);
    k3_sbuf_str(b, "[");
    for (size_t i = 0; s && i < len; i++) k3_sbuf_printf(b, "%s%u", i ? "," : "", (unsigned char)s[i]);
    k3_sbuf_str(b, "]");
}

/* A logprob as JSON: -9999.0 for -inf (JSON has no infinity), as OpenAI does. */
static void value(k3_sbuf *b, double lp) {
    if (isfinite(lp)) k3_sbuf_printf(b, "%.9g", lp);
    else k3_sbuf_str(b, "-9999.0");
}

void k3_logprobs_add(k3_logprobs *lp, const k3_tokenizer *t, const float *logits, int vocab,
                     int32_t id, int top, bool chat) {
    size_t len = 0;
    if (!k3_tokenizer_token_bytes(t, id, &len)) len = 0;
    int32_t ids[K3_TOP_LOGPROBS_MAX];
    if (top > K3_TOP_LOGPROBS_MAX) top = K3_TOP_LOGPROBS_MAX;
    double norm = logits ? log_norm(logits, vocab) : 0;
    int n_top = logits ? top_ids(logits, vocab, top, ids) : 0;
    if (chat) {
        k3_sbuf *b = &lp->content;
        k3_sbuf_str(b, lp->n ? ",{\"token\":" : "{\"token\":");
        token_str(b, t, id);
        k3_sbuf_str(b, ",\"logprob\":");
        value(b, logits[id] - norm);
        k3_sbuf_str(b, ",\"bytes\":");
        token_bytes(b, t, id);
        k3_sbuf_str(b, ",\"top_logprobs\":[");
        for (int k = 0; k < n_top; k++) {
            k3_sbuf_str(b, k ? ",{\"token\":" : "{\"token\":");
            token_str(b, t, ids[k]);
            k3_sbuf_str(b, ",\"logprob\":");
            value(b, logits[ids[k]] - norm);
            k3_sbuf_str(b, ",\"bytes\":");
            token_bytes(b, t, ids[k]);
            k3_sbuf_str(b, "}");
        }
        k3_sbuf_str(b, "]}");
    } else {
        const char *sep = lp->n ? "," : "";
        k3_sbuf_str(&lp->tokens, sep);
        token_str(&lp->tokens, t, id);
        k3_sbuf_str(&lp->values, sep);
        k3_sbuf_str(&lp->top, sep);
        if (!logits) { /* the first prompt token: nothing predicts it */
            k3_sbuf_str(&lp->values, "null");
            k3_sbuf_str(&lp->top, "null");
        } else {
            value(&lp->values, logits[id] - norm);
            k3_sbuf_str(&lp->top, "{");
            for (int k = 0; k < n_top; k++) {
                if (k) k3_sbuf_str(&lp->top, ",");
                token_str(&lp->top, t, ids[k]);
                k3_sbuf_str(&lp->top, ":");
                value(&lp->top, logits[ids[k]] - norm);
            }
            k3_sbuf_str(&lp->top, "}");
        }
        k3_sbuf_printf(&lp->offsets, "%s%zu", sep, lp->offset);
    }
    lp->offset += len;
    lp->n++;
}

void k3_logprobs_json(k3_sbuf *b, const k3_logprobs *lp, bool chat) {
    if (chat) {
        k3_sbuf_str(b, "{\"content\":[");
        k3_sbuf_add(b, lp->content.p ? lp->content.p : "", lp->content.len);
        k3_sbuf_str(b, "],\"refusal\":null}");
        return;
    }
    k3_sbuf_str(b, "{\"tokens\":[");
    k3_sbuf_add(b, lp->tokens.p ? lp->tokens.p : "", lp->tokens.len);
    k3_sbuf_str(b, "],\"token_logprobs\":[");
    k3_sbuf_add(b, lp->values.p ? lp->values.p : "", lp->values.len);
    k3_sbuf_str(b, "],\"top_logprobs\":[");
    k3_sbuf_add(b, lp->top.p ? lp->top.p : "", lp->top.len);
    k3_sbuf_str(b, "],\"text_offset\":[");
    k3_sbuf_add(b, lp->offsets.p ? lp->offsets.p : "", lp->offsets.len);
    k3_sbuf_str(b, "]}");
}

void k3_logprobs_free(k3_logprobs *lp) {
    k3_sbuf_free(&lp->content);
    k3_sbuf_free(&lp->tokens);
    k3_sbuf_free(&lp->values);
    k3_sbuf_free(&lp->top);
    k3_sbuf_free(&lp->offsets);
}
