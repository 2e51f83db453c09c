/* model_dir.c — see model_dir.h. */
#include "model_dir.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The variables that say where models are: the platform's (HOME, XDG_*) and the Hugging Face
 * tools' (HF_HUB_CACHE, HF_HOME), shared with other programs like OMP_NUM_THREADS, and
 * K3_MODELS. No flag sets them, so they are no rows of the option table: this is their one
 * reader (model_dir.h lists them; k3 --help and k3 setup --help name them). */
static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

char *k3_cli_models_dir(char *buf, size_t cap) {
    return k3_models_dir(buf, cap, env("K3_MODELS"), env("XDG_DATA_HOME"), env("HOME"));
}

int k3_model_arg(const char *cmd, const char *arg, const char **dir) {
    static char out[PATH_MAX]; /* CLI-only; main thread */
    if (!arg) {
        *dir = k3_default_model_dir();
        return 0;
    }
    char hub[PATH_MAX], models[PATH_MAX], note[1024];
    k3_hub_cache_dir(hub, sizeof hub, env("HF_HUB_CACHE"), env("HF_HOME"),
                     env("XDG_CACHE_HOME"), env("HOME"));
    k3_cli_models_dir(models, sizeof models);
    k3_err err = {0};
    int rc = k3_model_resolve(arg, hub, models, out, sizeof out, note, sizeof note, &err);
    if (rc) {
        char text[sizeof err.msg + 256]; /* as k3_opts_error, under cmd's own prefix */
        fprintf(stderr, "%s: %s\n", cmd, k3_opts_render(&err, text, sizeof text));
        return rc;
    }
    if (note[0]) fprintf(stderr, "%s: %s\n", cmd, note);
    *dir = out;
    return 0;
}

int k3_setup_default_dest(const char *repo, const char *revision, const char **dest) {
    static char out[PATH_MAX + 512]; /* CLI-only; main thread */
    char models[PATH_MAX];
    const char *why = !k3_repo_id_valid(repo) ? "--repo is no OWNER/NAME"
                      : revision && strchr(revision, '/') ? "a revision with '/' in it needs one"
                      : !k3_cli_models_dir(models, sizeof models)[0] ? "HOME is not set" : NULL;
    if (why) {
        fprintf(stderr, "k3 setup: give the folder to install into: %s (see k3 setup --help)\n",
                why);
        return 2;
    }
    /* main (the default) in MODELS/OWNER/NAME, another revision beside it in its own folder,
     * where OWNER/NAME@REV finds it (setup.h, part 4) */
    if (revision && strcmp(revision, K3_HF_REVISION))
        snprintf(out, sizeof out, "%s/%s@%s", models, repo, revision);
    else
        snprintf(out, sizeof out, "%s/%s", models, repo);
    fprintf(stderr, "k3 setup: installing into %s\n", out);
    *dest = out;
    return 0;
}
