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

/* ---- pinned revisions: OWNER/NAME@REV ---------------------------------------------- */

/* Commits as the hub names snapshots (40 hex digits): A and B share their first 7 digits. */
#define COMMIT_A "abcdef01" "11111111111111111111111111111111"
#define COMMIT_B "abcdef02" "22222222222222222222222222222222"
#define COMMIT_C "0123456" "777777777777777777777777777777777"
#define COMMIT_GONE "fedcba9" "888888888888888888888888888888888"
#define COMMIT_M "5555555" "666666666666666666666666666666666"
#define COMMIT_V "9999999" "444444444444444444444444444444444"

static void test_name_split(void) {
    static const char *yes[][3] = {{REPO, REPO, NULL}, {"a/b@main", "a/b", "main"},
                                   {"a/b@refs/pr/1", "a/b", "refs/pr/1"},
                                   {"a/b@" COMMIT_A, "a/b", COMMIT_A}, {"a/b@v1.0_rc-2", "a/b",
                                   "v1.0_rc-2"}};
    static const char *no[] = {"a/b@", "a/b@../x", "a/b@x/", "a/b@/x", "a/b@.x", "a/b@x//y",
                               "a/b@x/../y", "a/b@x y", "a@b", "a/b/c@main", "@main",
                               "a/b@x@y", "tests/fixtures/k3-nano"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        char repo[256] = "";
        const char *rev = "unset";
        bool ok = k3_model_name_split(yes[i][0], repo, sizeof repo, &rev);
        CHECK(ok && !strcmp(repo, yes[i][1]) &&
              (yes[i][2] ? rev && !strcmp(rev, yes[i][2]) : !rev),
              "'%s': %d '%s' '%s'", yes[i][0], ok, repo, rev ? rev : "(null)");
    }
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        CHECK(!k3_model_name_split(no[i], NULL, 0, NULL), "'%s' taken for a model name", no[i]);
}

/* The fake cache of the pinned tests: snapshots A, B (complete) and C (without shard 2);
 * refs/main -> B, refs/v2 -> A, refs/refs/pr/1 -> C (the hub cache's name for a PR's ref),
 * refs/v3 -> a commit without a snapshot. */
static int pinned_cache(const char *tmp) {
    if (add_snapshot(tmp, COMMIT_A, NULL) || add_snapshot(tmp, COMMIT_B, NULL) ||
        add_snapshot(tmp, COMMIT_C, SHARD2))
        return -1;
    return sh_in(tmp, "cd " REPO_DIR "/refs && mkdir -p refs/pr && echo " COMMIT_B " > main && "
                 "printf %s " COMMIT_A " > v2 && echo " COMMIT_C " > refs/pr/1 && "
                 "echo " COMMIT_GONE " > v3");
}

/* Each name resolves to the snapshot its revision names: a branch, a tag-like name, a PR
 * ref, a full commit, a unique short commit; OWNER/NAME alone is still refs/main's. */
static void test_pinned_hub(void) {
    char *tmp = k3t_tmpdir(), out[PATH_MAX], note[1024], want[PATH_MAX + 64];
    k3_err err = {0};
    if (!tmp || pinned_cache(tmp)) goto out;
    static const char *names[][2] = {
        {REPO "@main", COMMIT_B}, {REPO "@v2", COMMIT_A}, {REPO "@abcdef01", COMMIT_A},
        {REPO "@abcdef02222", COMMIT_B}, {REPO "@" COMMIT_A, COMMIT_A}, {REPO, COMMIT_B}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(want, sizeof want, "%s/" REPO_DIR "/snapshots/%s", tmp, names[i][1]);
        int rc = resolve(tmp, names[i][0], out, note, &err);
        if (rc || strcmp(out, want) || note[0]) {
            k3_test_fail(__FILE__, __LINE__, "%s: rc %d (%s): '%s', note '%s'", names[i][0], rc,
                         err.msg, out, note);
            goto out;
        }
    }
out:
    k3t_rm_dir(tmp);
}

/* A pinned revision is that one or an error, never another: a short commit beginning two
 * snapshots names both; an incomplete snapshot (by ref or by commit) names what it lacks
 * though complete ones exist; a ref to a commit without a snapshot says so; an unknown
 * revision names where it looked and the fix. */
static void test_pinned_hub_errors(void) {
    char *tmp = k3t_tmpdir(), out[PATH_MAX], note[1024];
    k3_err err = {0};
    if (!tmp || pinned_cache(tmp)) goto out;
    static const struct { const char *name; int rc; const char *says[3]; } cases[] = {
        {REPO "@abcdef0", K3_ERR_USAGE, {"abcdef0 begins 2 snapshots", COMMIT_A " and " COMMIT_B,
                                         "give more of the commit"}},
        {REPO "@refs/pr/1", K3_ERR_IO, {"snapshots/" COMMIT_C " lacks 1 file: " SHARD2,
                                        "k3 setup " REPO "@refs/pr/1", "no other revision"}},
        {REPO "@0123456", K3_ERR_IO, {"snapshots/" COMMIT_C " lacks 1 file: " SHARD2,
                                      "k3 setup " REPO "@0123456", "no other revision"}},
        {REPO "@v3", K3_ERR_IO, {"refs/v3 names commit " COMMIT_GONE, "which has no snapshot",
                                 "k3 setup " REPO "@v3"}},
        {REPO "@nope", K3_ERR_IO, {REPO_DIR "/refs/nope", REPO_DIR "/snapshots/nope",
                                   "k3 setup " REPO "@nope"}},
        {REPO "@x/../y", K3_ERR_USAGE, {"'x/../y' is no revision", "OWNER/NAME@main", ""}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        out[0] = 0;
        int rc = resolve(tmp, cases[i].name, out, note, &err);
        bool ok = rc == cases[i].rc;
        for (int k = 0; k < 3 && ok; k++) ok = strstr(err.msg, cases[i].says[k]) != NULL;
        CHECK(ok, "%s: rc %d (want %d), out '%s': %s", cases[i].name, rc, cases[i].rc, out,
              err.msg);
    }
out:
    k3t_rm_dir(tmp);
}

/* dir/.k3/setup.json as k3 setup writes it (the fields k3_model_resolve reads, and those a
 * manifest must have), for repo at ref, pinned to commit. */
static int write_manifest(const char *dir, const char *repo, const char *ref, const char *commit) {
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/.k3", dir);
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
    snprintf(p, sizeof p, "%s/.k3/setup.json", dir);
    FILE *f = fopen(p, "w");
    CHECK_OR(-1, f, "%s: %s", p, strerror(errno));
    fprintf(f, "{\"format\": 1, \"endpoint\": \"https://huggingface.co\", \"repo\": \"%s\", "
            "\"revision\": \"%s\", \"ref\": \"%s\", \"mode\": \"full\", \"files\": [], "
            "\"shards\": []}\n", repo, commit, ref);
    return fclose(f) == 0 ? 0 : -1;
}

/* Under K3_MODELS: OWNER/NAME@REV is MODELS/OWNER/NAME@REV (where k3 setup OWNER/NAME@REV
 * installs) or MODELS/OWNER/NAME, each only when its manifest records REV (the ref asked for,
 * the commit, or 7+ digits of it). The hub cache, which has the repository but not these
 * revisions, is passed over. Another revision, or no record, is refused with the fix. */
static void test_pinned_models(void) {
    char *tmp = k3t_tmpdir(), out[PATH_MAX], note[1024], want[PATH_MAX + 64], d[PATH_MAX];
    k3_err err = {0};
    if (!tmp || add_snapshot(tmp, COMMIT_A, NULL) ||
        sh_in(tmp, "echo " COMMIT_A " > " REPO_DIR "/refs/main && mkdir -p models/" REPO
              " models/" REPO "@v2 models/" REPO "@v1 && touch models/" REPO "/config.json "
              "models/" REPO "@v2/config.json models/" REPO "@v1/config.json"))
        goto out;
    static const char *const installs[][3] = {{"", "main", COMMIT_M}, {"@v2", "v2", COMMIT_V},
                                              {"@v1", "v2", COMMIT_V}}; /* @v1: a copy of v2 */
    for (int i = 0; i < 3; i++) {
        snprintf(d, sizeof d, "%s/models/" REPO "%s", tmp, installs[i][0]);
        if (write_manifest(d, REPO, installs[i][1], installs[i][2])) goto out;
    }
    static const char *names[][2] = {{REPO "@v2", "@v2"}, {REPO "@" COMMIT_M, ""},
                                     {REPO "@5555555", ""}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(want, sizeof want, "%s/models/" REPO "%s", tmp, names[i][1]);
        int rc = resolve(tmp, names[i][0], out, note, &err);
        if (rc || strcmp(out, want)) {
            k3_test_fail(__FILE__, __LINE__, "%s: rc %d (%s): '%s'", names[i][0], rc, err.msg,
                         out);
            goto out;
        }
    }
    /* v1's folder holds v2: refused, naming what each folder holds and the fix */
    int rc = resolve(tmp, REPO "@v1", out, note, &err);
    if (rc != K3_ERR_IO || !strstr(err.msg, "models/" REPO "@v1 holds revision v2, commit "
                                   COMMIT_V) ||
        !strstr(err.msg, "models/" REPO " holds revision main, commit " COMMIT_M) ||
        !strstr(err.msg, "install it with k3 setup " REPO "@v1")) {
        k3_test_fail(__FILE__, __LINE__, "rc %d: %s", rc, err.msg);
        goto out;
    }
    /* an install without its record is never taken for a revision */
    if (sh_in(tmp, "rm -r models/" REPO "/.k3")) goto out;
    rc = resolve(tmp, REPO "@5555555", out, note, &err);
    if (rc != K3_ERR_IO || !strstr(err.msg, "models/" REPO " has no record of its revision"))
        k3_test_fail(__FILE__, __LINE__, "rc %d: %s", rc, err.msg);
out:
    k3t_rm_dir(tmp);
}

/* The edge: k3 run, k3 tokenize and k3-lab take OWNER/NAME@REV through the one door and load
 * that snapshot (run and tokenize print what its folder given as a path prints; the load line
 * and bench decode's header name the folder); k3-lab's error for an ambiguous commit is the
 * resolver's. */
static void test_cli_pinned(void) {
    char *tmp = k3t_tmpdir(), args[2 * PATH_MAX + 256], want[PATH_MAX + 64];
    k3t_cli by_path = {0}, r = {0};
    if (!tmp || pinned_cache(tmp)) goto out;
    snprintf(want, sizeof want, "%s/" REPO_DIR "/snapshots/" COMMIT_A, tmp);
    static const char *const cmds[][2] = {
        {"run %s --prompt-ids 1,2,3 --max-new 4 --ids", NULL}, {"tokenize %s 'In the'", NULL},
        {"bench decode %s --tokens 1", "lab"}};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        bool lab = cmds[i][1] != NULL;
        snprintf(args, sizeof args, cmds[i][0], want);
        if (lab ? k3t_lab_run(args, &by_path) : k3t_cli_run(args, &by_path)) goto out;
        char pinned[256];
        snprintf(pinned, sizeof pinned, cmds[i][0], REPO "@v2");
        snprintf(args, sizeof args, "-u HF_HOME -u XDG_CACHE_HOME HF_HUB_CACHE=%s/hub '%s' %s",
                 tmp, lab ? k3t_lab_bin() : k3t_bin(), pinned);
        if (k3t_cli_run_in(NULL, "/usr/bin/env", args, &r)) goto out;
        /* run and tokenize print the same; bench decode its timings, after the folder */
        if (by_path.status || r.status || (!lab && strcmp(r.out, by_path.out)) ||
            (i == 0 && !strstr(r.err, want)) || (lab && !strstr(r.out, want))) {
            k3_test_fail(__FILE__, __LINE__, "%s: exit %d, out '%s' (by path: exit %d, '%s'): %s",
                         pinned, r.status, r.out, by_path.status, by_path.out, r.err);
            goto out;
        }
        k3t_cli_free(&r);
        k3t_cli_free(&by_path);
    }
    snprintf(args, sizeof args, "-u HF_HOME HF_HUB_CACHE=%s/hub '%s' bench io " REPO "@abcdef0",
             tmp, k3t_lab_bin());
    if (k3t_cli_run_in(NULL, "/usr/bin/env", args, &r)) goto out;
    if (r.status != K3_ERR_USAGE ||
        !strstr(r.err, "k3-lab bench io: " REPO "@abcdef0: abcdef0 begins 2 snapshots"))
        k3_test_fail(__FILE__, __LINE__, "exit %d: %s", r.status, r.err);
out:
    k3t_cli_free(&r);
    k3t_cli_free(&by_path);
    k3t_rm_dir(tmp);
}

/* k3 setup OWNER/NAME@REV is --repo OWNER/NAME --revision REV into MODELS/OWNER/NAME@REV
 * (main: MODELS/OWNER/NAME), where OWNER/NAME@REV finds it; a --repo or --revision saying
 * otherwise is a usage error. (The server does not answer: the URL shows the revision.) */
static void test_setup_name_at_rev(void) {
    char *tmp = k3t_tmpdir(), bin[PATH_MAX], args[2 * PATH_MAX + 256], want[PATH_MAX + 64];
    k3t_cli r = {0};
    if (!tmp) return;
    if (!realpath(k3t_bin(), bin)) {
        k3_test_fail(__FILE__, __LINE__, "%s: %s", k3t_bin(), strerror(errno));
        goto out;
    }
    static const struct { const char *args, *dest, *rev; int status; } cases[] = {
        {"owner/name@v2", "owner/name@v2", "v2", K3_ERR_NETWORK},
        {"owner/name@v2 --revision v2 --repo owner/name", "owner/name@v2", "v2", K3_ERR_NETWORK},
        {"--repo owner/name --revision " COMMIT_A, "owner/name@" COMMIT_A, COMMIT_A,
         K3_ERR_NETWORK},
        {"owner/name@main", "owner/name", "main", K3_ERR_NETWORK},
        {"owner/name@v2 --revision v3", NULL, "say otherwise", K3_ERR_USAGE},
        {"owner/name@v2 --repo other/name", NULL, "say otherwise", K3_ERR_USAGE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "K3_MODELS=%s/models '%s' setup %s --endpoint "
                 "http://127.0.0.1:9 --retries 0 --timeout 2", tmp, bin, cases[i].args);
        if (k3t_cli_run_in(tmp, "/usr/bin/env", args, &r)) goto out; /* a DEST lands in tmp */
        char url[128];
        snprintf(url, sizeof url, "/owner/name/resolve/%s/config.json", cases[i].rev);
        snprintf(want, sizeof want, "installing into %s/models/%s\n", tmp,
                 cases[i].dest ? cases[i].dest : "");
        bool ok = r.status == cases[i].status &&
                  (cases[i].dest ? strstr(r.err, want) && strstr(r.err, url)
                                 : strstr(r.err, cases[i].rev) && !strstr(r.err, "installing"));
        if (!ok) {
            k3_test_fail(__FILE__, __LINE__, "setup %s: exit %d: %s", cases[i].args, r.status,
                         r.err);
            goto out;
        }
        k3t_cli_free(&r);
    }
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
    {"name_split", test_name_split},
    {"pinned_hub", test_pinned_hub},
    {"pinned_hub_errors", test_pinned_hub_errors},
    {"pinned_models", test_pinned_models},
    {"cli_pinned", test_cli_pinned},
    {"setup_name_at_rev", test_setup_name_at_rev},
    {0},
};
