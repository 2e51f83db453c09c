/* test_byname.c — models by name (src/setup/setup.h, part 4; src/cli/model_dir.h): a fake
 * Hugging Face hub cache laid out as huggingface_hub writes it (blobs/ named by hash,
 * snapshots/REV/FILE symlinks into ../../blobs/, refs/main), built from the k3-nano fixture:
 * two revisions, one incomplete; the folder k3 setup installs into; the edge's variables. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/setup/setup.h"
#include "cli_run.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define REPO "moonshotai/Kimi-K3"
#define REPO_DIR "hub/models--moonshotai--Kimi-K3"
#define SHARD2 "model-00002-of-000011.safetensors"

/* Runs a shell command in dir; the test failed when it does not exit 0. */
static int sh_in(const char *dir, const char *cmd) {
    char full[8192];
    snprintf(full, sizeof full, "cd '%s' && { %s ; }", dir, cmd);
    int st = system(full);
    CHECK_OR(-1, st == 0, "exit %d: %s", st, cmd);
    return 0;
}

/* tmp/hub/models--moonshotai--Kimi-K3 with blobs of every k3-nano file (named by their
 * sha256, as the hub names LFS blobs) and snapshot `rev` linking each of them, except
 * `skip` (NULL: none). */
static int add_snapshot(const char *tmp, const char *rev, const char *skip) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "mkdir -p " REPO_DIR "/blobs " REPO_DIR "/refs " REPO_DIR "/snapshots/%s && "
             "for f in '%s'/" NANO "/*.*; do n=$(basename \"$f\"); "
             "b=$(sha256sum \"$f\" | cut -d' ' -f1); "
             "[ -f " REPO_DIR "/blobs/$b ] || cp \"$f\" " REPO_DIR "/blobs/$b; "
             "[ \"$n\" = '%s' ] || ln -s ../../blobs/$b " REPO_DIR "/snapshots/%s/$n; done",
             rev, getcwd((char[PATH_MAX]){0}, PATH_MAX), skip ? skip : "", rev);
    return sh_in(tmp, cmd);
}

static int resolve(const char *tmp, const char *arg, char *out, char *note, k3_err *err) {
    char hub[PATH_MAX], models[PATH_MAX];
    snprintf(hub, sizeof hub, "%s/hub", tmp);
    snprintf(models, sizeof models, "%s/models", tmp);
    return k3_model_resolve(arg, hub, models, out, PATH_MAX, note, 1024, err);
}

/* ---- the form of a name ------------------------------------------------------------- */

static void test_repo_id_form(void) {
    static const char *yes[] = {REPO, "a/b", "org_1/model.v2-x", "A-B/c_d.e"};
    static const char *no[] = {"",          "a",      "/abs/x",  "./x",  "../x",
                               "a/b/c",     "a//b",   "a/",      "/b",   "-a/b",
                               "a/.b",      "a/b..c", "a/b--c",  "a b/c", "a/b\n",
                               "tests/fixtures/k3-nano"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        CHECK(k3_repo_id_valid(yes[i]), "'%s' refused", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        CHECK(!k3_repo_id_valid(no[i]), "'%s' taken for a repository id", no[i]);
}

/* huggingface_hub's constants.py: HF_HUB_CACHE, else HF_HOME/hub, HF_HOME defaulting to
 * XDG_CACHE_HOME/huggingface, XDG_CACHE_HOME to ~/.cache. */
static void test_cache_roots(void) {
    char b[PATH_MAX];
    CHECK(!strcmp(k3_hub_cache_dir(b, sizeof b, "/c", "/h", "/x", "/home/u"), "/c"), "%s", b);
    CHECK(!strcmp(k3_hub_cache_dir(b, sizeof b, "", "/h", "/x", "/home/u"), "/h/hub"), "%s", b);
    CHECK(!strcmp(k3_hub_cache_dir(b, sizeof b, NULL, NULL, "/x", "/home/u"),
                  "/x/huggingface/hub"), "%s", b);
    CHECK(!strcmp(k3_hub_cache_dir(b, sizeof b, NULL, NULL, NULL, "/home/u"),
                  "/home/u/.cache/huggingface/hub"), "%s", b);
    CHECK(!k3_hub_cache_dir(b, sizeof b, NULL, NULL, NULL, NULL)[0], "no HOME: %s", b);
    CHECK(!k3_hub_cache_dir(b, sizeof b, "rel", NULL, NULL, NULL)[0], "relative: %s", b);
    CHECK(!strcmp(k3_models_dir(b, sizeof b, "/m", "/d", "/home/u"), "/m"), "%s", b);
    CHECK(!strcmp(k3_models_dir(b, sizeof b, NULL, "/d", "/home/u"), "/d/k3/models"), "%s", b);
    CHECK(!strcmp(k3_models_dir(b, sizeof b, "", "", "/home/u"),
                  "/home/u/.local/share/k3/models"), "%s", b);
}

/* ---- the fake cache ------------------------------------------------------------------ */

/* Two revisions: aaa complete, bbb (refs/main, newer) without shard 2: aaa is used and the
 * note names what bbb lacks; once bbb is complete it is used; a link whose blob is gone is
 * missing; none complete is an error naming the file and k3 setup. */
static void test_newest_complete_snapshot(void) {
    char *tmp = k3t_tmpdir(), out[PATH_MAX], note[1024], want[PATH_MAX + 64];
    k3_err err = {0};
    if (!tmp || add_snapshot(tmp, "aaa", NULL) || add_snapshot(tmp, "bbb", SHARD2) ||
        sh_in(tmp, "echo bbb > " REPO_DIR "/refs/main && touch -d '2026-01-01' "
                   REPO_DIR "/snapshots/aaa && touch -d '2026-02-01' " REPO_DIR "/snapshots/bbb"))
        goto out;
    snprintf(want, sizeof want, "%s/" REPO_DIR "/snapshots/aaa", tmp);
    int rc = resolve(tmp, REPO, out, note, &err);
    if (rc || strcmp(out, want) || !strstr(note, "bbb, lacks 1 file (" SHARD2 ")") ||
        !strstr(note, "using aaa")) {
        k3_test_fail(__FILE__, __LINE__, "rc %d (%s): '%s', note '%s'", rc, err.msg, out, note);
        goto out;
    }
    /* complete bbb: now refs/main's snapshot is used, without a note */
    char cmd[PATH_MAX + 256];
    snprintf(cmd, sizeof cmd, "b=$(sha256sum '%s/" NANO "/" SHARD2 "' | cut -d' ' -f1) && "
             "ln -s ../../blobs/$b " REPO_DIR "/snapshots/bbb/" SHARD2,
             getcwd((char[PATH_MAX]){0}, PATH_MAX));
    if (sh_in(tmp, cmd)) goto out;
    snprintf(want, sizeof want, "%s/" REPO_DIR "/snapshots/bbb", tmp);
    rc = resolve(tmp, REPO, out, note, &err);
    if (rc || strcmp(out, want) || note[0]) {
        k3_test_fail(__FILE__, __LINE__, "rc %d (%s): '%s', note '%s'", rc, err.msg, out, note);
        goto out;
    }
    /* the blob of shard 2 gone: both links dangle, no snapshot is complete */
    snprintf(cmd, sizeof cmd, "rm " REPO_DIR "/blobs/$(sha256sum '%s/" NANO "/" SHARD2
             "' | cut -d' ' -f1)", getcwd((char[PATH_MAX]){0}, PATH_MAX));
    if (sh_in(tmp, cmd)) goto out;
    rc = resolve(tmp, REPO, out, note, &err);
    if (rc != K3_ERR_IO || !strstr(err.msg, "snapshots/bbb, lacks 1 file: " SHARD2) ||
        !strstr(err.msg, "1 older snapshot lacks files too") ||
        !strstr(err.msg, "k3 setup --repo " REPO))
        k3_test_fail(__FILE__, __LINE__, "rc %d: %s", rc, err.msg);
out:
    k3t_rm_dir(tmp);
}

/* Without refs/main the newest modification time wins, whichever name sorts first. */
static void test_newest_by_time(void) {
    char *tmp = k3t_tmpdir(), out[PATH_MAX], note[1024], want[PATH_MAX + 64];
    k3_err err = {0};
    if (!tmp || add_snapshot(tmp, "zzz", NULL) || add_snapshot(tmp, "aaa", NULL) ||
        sh_in(tmp, "touch -d '2026-01-01' " REPO_DIR "/snapshots/zzz && "
                   "touch -d '2026-03-01' " REPO_DIR "/snapshots/aaa"))
        goto out;
    snprintf(want, sizeof want, "%s/" REPO_DIR "/snapshots/aaa", tmp);
    int rc = resolve(tmp, REPO, out, note, &err);
    if (rc || strcmp(out, want))
        k3_test_fail(__FILE__, __LINE__, "rc %d (%s): '%s'", rc, err.msg, out);
out:
    k3t_rm_dir(tmp);
}

/* Not in the cache: k3 setup's folder (MODELS/OWNER/NAME) when it holds config.json; neither:
 * an error naming both places. A path is never reinterpreted. */
static void test_setup_folder_and_paths(void) {
    char *tmp = k3t_tmpdir(), out[PATH_MAX], note[1024], want[PATH_MAX + 64];
    k3_err err = {0};
    if (!tmp) return;
    int rc = resolve(tmp, REPO, out, note, &err);
    if (rc != K3_ERR_IO || !strstr(err.msg, "no snapshot in the Hugging Face cache") ||
        !strstr(err.msg, "models/" REPO) || !strstr(err.msg, "k3 setup --repo " REPO)) {
        k3_test_fail(__FILE__, __LINE__, "rc %d: %s", rc, err.msg);
        goto out;
    }
    if (sh_in(tmp, "mkdir -p models/" REPO " && touch models/" REPO "/config.json")) goto out;
    snprintf(want, sizeof want, "%s/models/" REPO, tmp);
    rc = resolve(tmp, REPO, out, note, &err);
    if (rc || strcmp(out, want)) {
        k3_test_fail(__FILE__, __LINE__, "rc %d (%s): '%s'", rc, err.msg, out);
        goto out;
    }
    /* a folder path, or a missing path that is no name, comes back as given */
    static const char *as_is[] = {NANO, "/no/such/folder", "no-such-folder"};
    for (size_t i = 0; i < sizeof as_is / sizeof *as_is; i++) {
        rc = resolve(tmp, as_is[i], out, note, &err);
        if (rc || strcmp(out, as_is[i])) {
            k3_test_fail(__FILE__, __LINE__, "%s: rc %d '%s'", as_is[i], rc, out);
            goto out;
        }
    }
    /* a folder in the working directory spelled like a name is that folder */
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd) || chdir(tmp) != 0) goto out;
    if (sh_in(".", "mkdir -p " REPO) == 0) {
        rc = resolve(tmp, REPO, out, note, &err);
        if (rc || strcmp(out, REPO)) k3_test_fail(__FILE__, __LINE__, "rc %d '%s'", rc, out);
    }
    if (chdir(cwd) != 0) k3_test_fail(__FILE__, __LINE__, "chdir back: %s", strerror(errno));
out:
    k3t_rm_dir(tmp);
}

/* A snapshot whose index is no JSON with a weight_map of plain file names is an error naming
 * the index, not a snapshot that merely lacks files. */
static void test_bad_index(void) {
    static const char *bodies[] = {"{", "{\"weight_map\": {\"a.weight\": \"../x.safetensors\"}}"};
    static const char *says[] = {"no \"weight_map\" object", "tensor a.weight: shard name is "
                                 "not a plain file name"};
    for (int i = 0; i < 2; i++) {
        char *tmp = k3t_tmpdir(), out[PATH_MAX], note[1024], cmd[512];
        k3_err err = {0};
        snprintf(cmd, sizeof cmd, "d=" REPO_DIR "/snapshots/bad && rm $d/model.safetensors.index.json"
                 " && printf '%%s' '%s' > $d/model.safetensors.index.json", bodies[i]);
        if (!tmp || add_snapshot(tmp, "bad", NULL) || sh_in(tmp, cmd)) {
            k3t_rm_dir(tmp);
            return;
        }
        int rc = resolve(tmp, REPO, out, note, &err);
        k3t_rm_dir(tmp);
        CHECK(rc == K3_ERR_CHECKPOINT && strstr(err.msg, "snapshots/bad/model.safetensors.index"
              ".json: ") && strstr(err.msg, says[i]), "rc %d: %s", rc, err.msg);
    }
}

/* The edge: k3 finds the cache through HF_HUB_CACHE, HF_HOME and HOME, loads the snapshot by
 * name (the load line names its folder) and prints what the same folder given as a path
 * prints; k3 setup's default folder is found through K3_MODELS. */
static void test_cli_by_name(void) {
    char *tmp = k3t_tmpdir(), bin[PATH_MAX], args[2 * PATH_MAX + 256];
    k3t_cli by_path = {0}, r = {0};
    char cmd[PATH_MAX + 256];
    snprintf(cmd, sizeof cmd, "mkdir -p home/.cache models/" REPO " && ln -s ../.. "
             "home/.cache/huggingface && cp '%s'/" NANO "/*.* models/" REPO,
             getcwd((char[PATH_MAX]){0}, PATH_MAX));
    if (!tmp || add_snapshot(tmp, "c0ffee", NULL) || sh_in(tmp, cmd)) goto out;
    if (!realpath(k3t_bin(), bin)) {
        k3_test_fail(__FILE__, __LINE__, "%s: %s", k3t_bin(), strerror(errno));
        goto out;
    }
    if (k3t_cli_run("run " NANO " --prompt-ids 1,2,3 --max-new 4 --ids", &by_path)) goto out;
    static const char *envs[] = {"HF_HUB_CACHE=%s/hub", "HF_HOME=%s", "HOME=%s/home",
                                 "K3_MODELS=%s/models HOME=/nonexistent"};
    static const char *where[] = {"/snapshots/c0ffee", "/snapshots/c0ffee", "/snapshots/c0ffee",
                                  "/models/" REPO};
    for (size_t i = 0; i < sizeof envs / sizeof *envs; i++) {
        char env[PATH_MAX + 64];
        snprintf(env, sizeof env, envs[i], tmp);
        snprintf(args, sizeof args, "-u HF_HUB_CACHE -u HF_HOME -u XDG_CACHE_HOME -u K3_MODELS "
                 "%s '%s' run " REPO " --prompt-ids 1,2,3 --max-new 4 --ids", env, bin);
        if (k3t_cli_run_in(NULL, "/usr/bin/env", args, &r)) goto out;
        if (r.status || strcmp(r.out, by_path.out) || !strstr(r.err, where[i])) {
            k3_test_fail(__FILE__, __LINE__, "%s: exit %d, out '%s' (by path '%s'): %s", env,
                         r.status, r.out, by_path.out, r.err);
            goto out;
        }
        k3t_cli_free(&r);
    }
out:
    k3t_cli_free(&r);
    k3t_cli_free(&by_path);
    k3t_rm_dir(tmp);
}

/* k3 serve by name serves the name (not its snapshot's revision); by path, the folder's name
 * as before. The server is stopped with SIGINT once it printed where it listens. */
static void test_serve_model_id(void) {
    char *tmp = k3t_tmpdir(), bin[PATH_MAX], args[3 * PATH_MAX + 512];
    k3t_cli r = {0};
    if (!tmp || add_snapshot(tmp, "c0ffee", NULL)) goto out;
    if (!realpath(k3t_bin(), bin)) {
        k3_test_fail(__FILE__, __LINE__, "%s: %s", k3t_bin(), strerror(errno));
        goto out;
    }
    static const char *models[] = {REPO, "%s/" REPO_DIR "/snapshots/c0ffee"};
    static const char *ids[] = {"(model \"" REPO "\" from %s/" REPO_DIR "/snapshots/c0ffee)",
                                "(model \"c0ffee\" from %s/" REPO_DIR "/snapshots/c0ffee)"};
    for (int i = 0; i < 2; i++) {
        char model[PATH_MAX + 64], want[PATH_MAX + 128];
        snprintf(model, sizeof model, models[i], tmp);
        snprintf(want, sizeof want, ids[i], tmp);
        snprintf(args, sizeof args, "-c 'HF_HUB_CACHE=%s/hub \"%s\" serve %s --port 0 -q & p=$!; "
                 "for i in $(seq 1 600); do grep -q listening %s/serve.out 2>/dev/null && break; "
                 "sleep 0.1; done; kill -INT $p; wait $p' >%s/serve.out 2>&1; cat %s/serve.out",
                 tmp, bin, model, tmp, tmp, tmp);
        if (k3t_cli_run_in(NULL, "/bin/sh", args, &r)) goto out;
        if (!strstr(r.out, want)) {
            k3_test_fail(__FILE__, __LINE__, "want '%s' in: %s%s", want, r.out, r.err);
            goto out;
        }
        k3t_cli_free(&r);
    }
out:
    k3t_cli_free(&r);
    k3t_rm_dir(tmp);
}

/* k3 setup without DEST installs into K3_MODELS/REPO, where a name finds it, and its help
 * says so. (The install itself is tests/setup/run.sh's; here the server does not answer.) */
static void test_setup_default_dest(void) {
    char *tmp = k3t_tmpdir(), bin[PATH_MAX], args[2 * PATH_MAX + 256];
    k3t_cli r = {0};
    if (!tmp) return;
    if (!realpath(k3t_bin(), bin)) {
        k3_test_fail(__FILE__, __LINE__, "%s: %s", k3t_bin(), strerror(errno));
        goto out;
    }
    snprintf(args, sizeof args, "K3_MODELS=%s/models '%s' setup --endpoint http://127.0.0.1:9 "
             "--repo owner/name --retries 0 --timeout 2", tmp, bin);
    if (k3t_cli_run_in(NULL, "/usr/bin/env", args, &r)) goto out;
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "installing into %s/models/owner/name\n", tmp);
    if (r.status != K3_ERR_NETWORK || !strstr(r.err, want)) {
        k3_test_fail(__FILE__, __LINE__, "exit %d: %s", r.status, r.err);
        goto out;
    }
    k3t_cli_free(&r);
    if (k3t_cli_run("setup --help", &r)) goto out;
    if (r.status || !strstr(r.out, "DEST defaults to MODELS/REPO") ||
        !strstr(r.out, "$K3_MODELS, else\n$XDG_DATA_HOME/k3/models, else ~/.local/share/k3/models"))
        k3_test_fail(__FILE__, __LINE__, "k3 setup --help: %s", r.out);
out:
    k3t_cli_free(&r);
    k3t_rm_dir(tmp);
}

const k3_test k3_suite_byname[] = {
    {"repo_id_form", test_repo_id_form},
    {"cache_roots", test_cache_roots},
    {"newest_complete_snapshot", test_newest_complete_snapshot},
    {"newest_by_time", test_newest_by_time},
    {"setup_folder_and_paths", test_setup_folder_and_paths},
    {"bad_index", test_bad_index},
    {"cli_by_name", test_cli_by_name},
    {"serve_model_id", test_serve_model_id},
    {"setup_default_dest", test_setup_default_dest},
    {0},
};
