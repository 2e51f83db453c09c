/* model_dir.c — see model_dir.h. */
#include "model_dir.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../setup/setup.h"
#include "opts.h"

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
            if (snprintf(buf, sizeof buf, "%s/" K3_INSTALLED_MODEL, exe) < (int)sizeof buf &&
                is_model_dir(buf)) /* PREFIX/bin/k3 */
                return buf;
        }
    }
    if (!is_model_dir(K3_BUNDLED_MODEL))
        fprintf(stderr, "k3: no MODEL_DIR given, and the bundled fixture model (%s) is neither "
                "beside this k3 (%s), nor installed beside it (" K3_INSTALLED_MODEL "), nor "
                "under the current folder: give a model folder (a Hugging Face snapshot of "
                "moonshotai/Kimi-K3) or its name as the first argument, e.g. k3 run "
                "/path/to/Kimi-K3 --prompt TEXT\n", K3_BUNDLED_MODEL,
                n > 0 ? exe : "its folder is unknown");
    return K3_BUNDLED_MODEL;
}

char *k3_cli_models_dir(char *buf, size_t cap) {
    return k3_models_dir(buf, cap, k3_opts_env("K3_MODELS"), k3_opts_env("XDG_DATA_HOME"),
                         k3_opts_env("HOME"));
}

int k3_model_arg(const char *cmd, const char *arg, const char **dir) {
    static char out[PATH_MAX]; /* CLI-only; main thread */
    if (!arg) {
        *dir = k3_default_model_dir();
        return 0;
    }
    char hub[PATH_MAX], models[PATH_MAX], note[1024];
    k3_hub_cache_dir(hub, sizeof hub, k3_opts_env("HF_HUB_CACHE"), k3_opts_env("HF_HOME"),
                     k3_opts_env("XDG_CACHE_HOME"), k3_opts_env("HOME"));
    k3_cli_models_dir(models, sizeof models);
    k3_err err = {0};
    int rc = k3_model_resolve(arg, hub, models, out, sizeof out, note, sizeof note, &err);
    if (rc) {
        fprintf(stderr, "k3 %s: %s\n", cmd, err.msg);
        return rc;
    }
    if (note[0]) fprintf(stderr, "k3 %s: %s\n", cmd, note);
    *dir = out;
    return 0;
}
