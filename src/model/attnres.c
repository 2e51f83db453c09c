/* attnres.c — Block Attention Residuals (spec §5). */
#include <math.h>

#include "layers.h"

void k3_attn_res(const float *const *values, int n, const float *sw, int hidden, float eps,
                 float *out) {
    float score[K3_MAX_RES_VALUES];
    for (int j = 0; j < n; j++) {
        const float *v = values[j];
        float ss = 0;
        for (int i = 0; i < hidden; i++) ss += v[i] * v[i];
        float r = 1.0f / sqrtf(ss / (float)hidden + eps);
        float dot = 0;
        for (int i = 0; i < hidden; i++) dot += (v[i] * r) * sw[i];
        score[j] = dot;
    }
    float mx = score[0], sum = 0;
    for (int j = 1; j < n; j++) mx = score[j] > mx ? score[j] : mx;
    for (int j = 0; j < n; j++) sum += (score[j] = expf(score[j] - mx));
    for (int j = 0; j < n; j++) score[j] = score[j] / sum;
    for (int i = 0; i < hidden; i++) {
        float acc = 0;
        for (int j = 0; j < n; j++) acc += score[j] * values[j][i];
        out[i] = acc;
    }
}
