/* model_dir.c — see model_dir.h. */
#include "model_dir.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_model_dir(const char *dir) {
    char p[PATH_MAX + 32];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/config.json", dir) >= (int)sizeof p) return 0;
    return stat(p, &st) == 0;
}

const char *k3_default_model_dir(void) {
    static char buf[PATH_MAX + 64]; /* CLI-only; written before any thread starts */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            if (snprintf(buf, sizeof buf, "%s/" K3_BUNDLED_MODEL, exe) < (int)sizeof buf &&
                is_model_dir(buf))
                return buf;
            if (snprintf(buf, sizeof buf, "%s/../" K3_BUNDLED_MODEL, exe) < (int)sizeof buf &&
                is_model_dir(buf)) /* build/k3 */
                return buf;
        }
    }
    if (!is_model_dir(K3_BUNDLED_MODEL))
        fprintf(stderr, "k3: no MODEL_DIR given, and the bundled fixture model (%s) is neither "
                "beside this k3 (%s) nor under the current folder: give a model folder (a "
                "Hugging Face snapshot of moonshotai/Kimi-K3) as the first argument, e.g. "
                "k3 run /path/to/Kimi-K3 --prompt TEXT\n", K3_BUNDLED_MODEL,
                n > 0 ? exe : "its folder is unknown");
    return K3_BUNDLED_MODEL;
}
