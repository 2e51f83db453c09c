/* byname.c — models by name: a repository id to a snapshot folder in the Hugging Face hub
 * cache, or to the folder `k3 setup` installs into (setup.h, part 4). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../util/fileio.h"
#include "setup_internal.h"

/* The index of a full-size snapshot lists ~500k tensors (~40 MB of JSON). */
#define INDEX_MAX_BYTES (256u << 20)
#define LIST_MAX 8 /* missing files named in a message; the rest are counted */

/* ---- names and roots ------------------------------------------------------------------ */

/* One half of OWNER/NAME: 1-96 of [A-Za-z0-9._-], not starting with '.' or '-', no ".."
 * or "--" (the hub's own rule; it also keeps "./x" and "../x" out). */
static bool repo_part_ok(const char *s, size_t n) {
    if (n < 1 || n > 96 || s[0] == '.' || s[0] == '-') return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) return false;
        if (i && (c == '.' || c == '-') && s[i - 1] == c) return false;
    }
    return true;
}

bool k3_repo_id_valid(const char *s) {
    const char *slash = s ? strchr(s, '/') : NULL;
    if (!slash || strchr(slash + 1, '/')) return false;
    return repo_part_ok(s, (size_t)(slash - s)) && repo_part_ok(slash + 1, strlen(slash + 1));
}

/* REV of OWNER/NAME@REV: 1-200 characters, '/'-separated parts of [A-Za-z0-9._-], none empty
 * or starting with '.' (a branch or tag as the hub cache's refs/ stores it, e.g. refs/pr/1, or a
 * commit): nothing in it can climb out of refs/ or snapshots/. */
static bool rev_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 200) return false;
    for (const char *p = s; *p;) {
        size_t part = strcspn(p, "/");
        if (!part || p[0] == '.') return false;
        for (size_t i = 0; i < part; i++) {
            char c = p[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-'))
                return false;
        }
        p += part;
        if (*p == '/' && !*++p) return false; /* a trailing '/' */
    }
    return true;
}

/* Whether rev may be a commit or its short form, as git and the hub shorten it: 7-40 hex. */
static bool commit_prefix(const char *rev) {
    size_t n = strlen(rev);
    return n >= 7 && n <= 40 && strspn(rev, "0123456789abcdef") == n;
}

/* repo (cap bytes) = the OWNER/NAME part of s, when that part is a repository id; *rev = what
 * follows the first '@' (NULL: no '@'), unchecked. */
static bool split_name(const char *s, char *repo, size_t cap, const char **rev) {
    const char *at = strchr(s, '@');
    size_t n = at ? (size_t)(at - s) : strlen(s);
    if (n >= cap) return false;
    memcpy(repo, s, n);
    repo[n] = 0;
    *rev = at ? at + 1 : NULL;
    return k3_repo_id_valid(repo);
}

bool k3_model_name_split(const char *s, char *repo, size_t cap, const char **rev) {
    char buf[256];
    const char *r;
    if (!s || !split_name(s, buf, sizeof buf, &r) || (r && !rev_ok(r))) return false;
    if (repo && snprintf(repo, cap, "%s", buf) >= (int)cap) return false;
    if (rev) *rev = r;
    return true;
}

/* buf = a + b (b may be ""); "" when it does not fit or a is not absolute. */
static char *join_abs(char *buf, size_t cap, const char *a, const char *b) {
    buf[0] = 0;
    if (!a || a[0] != '/') return buf;
    if (snprintf(buf, cap, "%s%s", a, b) >= (int)cap) buf[0] = 0;
    return buf;
}

char *k3_hub_cache_dir(char *buf, size_t cap, const char *hf_hub_cache, const char *hf_home,
                       const char *xdg_cache_home, const char *home) {
    if (hf_hub_cache && hf_hub_cache[0]) return join_abs(buf, cap, hf_hub_cache, "");
    if (hf_home && hf_home[0]) return join_abs(buf, cap, hf_home, "/hub");
    if (xdg_cache_home && xdg_cache_home[0])
        return join_abs(buf, cap, xdg_cache_home, "/huggingface/hub");
    return join_abs(buf, cap, home, "/.cache/huggingface/hub");
}

char *k3_models_dir(char *buf, size_t cap, const char *k3_models, const char *xdg_data_home,
                    const char *home) {
    if (k3_models && k3_models[0]) return join_abs(buf, cap, k3_models, "");
    if (xdg_data_home && xdg_data_home[0]) return join_abs(buf, cap, xdg_data_home, "/k3/models");
    return join_abs(buf, cap, home, "/.local/share/k3/models");
}

/* ---- one snapshot --------------------------------------------------------------------- */

/* What a snapshot lacks: its count and the first LIST_MAX names, ", "-separated. */
typedef struct lack {
    int n;
    char names[LIST_MAX * 64];
} lack;

/* Whether dir/name exists as a file, symlinks followed (a link into blobs/ whose blob is
 * gone, or still NAME.incomplete, is missing). */
static bool present(const char *dir, const char *name) {
    char p[PATH_MAX];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p) return false;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static void need(lack *l, const char *dir, const char *name) {
    if (present(dir, name)) return;
    if (l->n++ < LIST_MAX) {
        size_t len = strlen(l->names);
        snprintf(l->names + len, sizeof l->names - len, "%s%s", len ? ", " : "", name);
    }
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The distinct shard names of an index's weight_map, sorted, into *out (malloc'd; the
 * strings are wm's). Each name is checked against the last one first: an index lists a
 * shard's tensors in runs, and K3's lists ~500k tensors in a few dozen shards. */
static int index_shards(const char *path, const cJSON *wm, const char ***out, int *n,
                        k3_err *err) {
    const char **uniq = NULL, *last = NULL;
    int n_uniq = 0, cap = 0, rc = K3_OK;
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        const char *s = cJSON_IsString(e) ? e->valuestring : "";
        if (last && !strcmp(last, s)) continue;
        if (!s[0] || s[0] == '.' || strchr(s, '/')) {
            rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s: shard name is not a plain file "
                         "name", path, e->string);
            break;
        }
        last = s;
        int i = 0;
        while (i < n_uniq && strcmp(uniq[i], s)) i++;
        if (i < n_uniq) continue;
        if (n_uniq == cap) {
            const char **v = realloc(uniq, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *v);
            if (!v) {
                rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
                break;
            }
            uniq = v;
        }
        uniq[n_uniq++] = s;
    }
    if (rc) {
        free(uniq);
        return rc;
    }
    if (n_uniq) qsort(uniq, (size_t)n_uniq, sizeof *uniq, cmp_str);
    *out = uniq;
    *n = n_uniq;
    return K3_OK;
}

/* Fills *l with what dir lacks of a complete snapshot: config.json, the tokenizer files, the
 * index and every shard its weight_map names (or model.safetensors without an index).
 * Returns 0, or an error for an index that cannot be read or parsed. */
static int snapshot_lacks(const char *dir, lack *l, k3_err *err) {
    memset(l, 0, sizeof *l);
    need(l, dir, "config.json");
    need(l, dir, "tiktoken.model");
    need(l, dir, "tokenizer_config.json");
    if (!present(dir, "model.safetensors.index.json")) {
        if (!present(dir, "model.safetensors")) need(l, dir, "model.safetensors.index.json");
        return K3_OK;
    }
    char path[PATH_MAX], *json = NULL;
    if (snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= (int)sizeof path)
        return k3_fail(err, K3_ERR_IO, "%s: path too long", dir);
    int rc = k3_read_file(path, INDEX_MAX_BYTES, &json, NULL, err);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(json);
    free(json);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    const char **shards = NULL;
    int n = 0;
    if (!cJSON_IsObject(wm))
        rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: malformed JSON or no \"weight_map\" object",
                     path);
    else if (!(rc = index_shards(path, wm, &shards, &n, err)))
        for (int i = 0; i < n; i++) need(l, dir, shards[i]);
    free(shards);
    cJSON_Delete(root);
    return rc;
}

/* ---- the cache's snapshots ------------------------------------------------------------ */

typedef struct snap {
    char name[NAME_MAX + 1];
    struct timespec mtime;
} snap;

/* Later first: the newer modification time, then the greater name (deterministic). */
static int snap_cmp(const void *pa, const void *pb) {
    const snap *a = pa, *b = pb;
    if (a->mtime.tv_sec != b->mtime.tv_sec) return a->mtime.tv_sec < b->mtime.tv_sec ? 1 : -1;
    if (a->mtime.tv_nsec != b->mtime.tv_nsec) return a->mtime.tv_nsec < b->mtime.tv_nsec ? 1 : -1;
    return strcmp(b->name, a->name);
}

/* The commit that repo_dir/refs/NAME holds (the hub's tools write one per branch or tag they
 * downloaded: refs/main, refs/refs/pr/1), into ref; "" when there is none or it is no plain
 * name (so it cannot lead outside snapshots/). */
static void read_ref(const char *repo_dir, const char *name, char *ref, size_t cap) {
    char p[PATH_MAX], *txt = NULL;
    k3_err ignored;
    ref[0] = 0;
    if (snprintf(p, sizeof p, "%s/refs/%s", repo_dir, name) >= (int)sizeof p ||
        k3_read_file(p, 256, &txt, NULL, &ignored))
        return;
    int n = (int)strcspn(txt, " \r\n");
    if (n && txt[0] != '.' && !memchr(txt, '/', (size_t)n) && n < (int)cap)
        snprintf(ref, cap, "%.*s", n, txt);
    free(txt);
}

static int snap_name_cmp(const void *a, const void *b) {
    return strcmp(((const snap *)a)->name, ((const snap *)b)->name);
}

/* The snapshot folders of repo_dir/snapshots, newest first; refs/main's first of all. */
static int list_snapshots(const char *repo_dir, snap **out, int *n, k3_err *err) {
    char p[PATH_MAX];
    *out = NULL;
    *n = 0;
    if (snprintf(p, sizeof p, "%s/snapshots", repo_dir) >= (int)sizeof p)
        return k3_fail(err, K3_ERR_IO, "%s: path too long", repo_dir);
    DIR *d = opendir(p);
    if (!d) return errno == ENOENT ? K3_OK : k3_fail(err, K3_ERR_IO, "%s: %s", p, strerror(errno));
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        struct stat st;
        char sp[PATH_MAX];
        if (e->d_name[0] == '.' || snprintf(sp, sizeof sp, "%s/%s", p, e->d_name) >= (int)sizeof sp
            || stat(sp, &st) || !S_ISDIR(st.st_mode))
            continue;
        if (*n == cap) {
            snap *v = realloc(*out, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *v);
            if (!v) {
                closedir(d);
                return k3_fail(err, K3_ERR_GENERIC, "out of memory");
            }
            *out = v;
        }
        snprintf((*out)[*n].name, sizeof (*out)[*n].name, "%s", e->d_name);
        (*out)[(*n)++].mtime = st.st_mtim;
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, snap_cmp);
    /* refs/main names the revision the hub's tools download by default: try it first */
    char ref[128];
    read_ref(repo_dir, "main", ref, sizeof ref);
    for (int i = 1; i < *n && ref[0]; i++)
        if (!strcmp((*out)[i].name, ref)) {
            snap s = (*out)[i];
            memmove(*out + 1, *out, (size_t)i * sizeof **out);
            (*out)[0] = s;
        }
    return K3_OK;
}

/* {hub}/models--OWNER--NAME, the hub cache's folder of repository OWNER/NAME. */
static void hub_repo_dir(char *buf, size_t cap, const char *hub, const char *repo) {
    size_t slash = strcspn(repo, "/");
    snprintf(buf, cap, "%s/models--%.*s--%s", hub, (int)slash, repo, repo + slash + 1);
}

/* The newest complete snapshot of repo in the hub cache: 0 with *found = true and out set;
 * 0 with *found = false when the cache has no snapshot of it (why in `why`); an error when
 * it has snapshots and none is complete (the message names what the newest lacks). */
static int from_hub(const char *repo, const char *hub, char *out, size_t cap, bool *found,
                    char *why, size_t why_cap, char *note, size_t note_cap, k3_err *err) {
    char repo_dir[PATH_MAX];
    *found = false;
    hub_repo_dir(repo_dir, sizeof repo_dir, hub, repo);
    snap *s;
    int n, rc = list_snapshots(repo_dir, &s, &n, err);
    if (rc) return rc;
    if (!n) {
        snprintf(why, why_cap, "no snapshot in the Hugging Face cache (%s/snapshots)", repo_dir);
        return K3_OK;
    }
    lack first = {0};
    for (int i = 0; i < n && !rc && !*found; i++) {
        lack l;
        char dir[PATH_MAX];
        if (snprintf(dir, sizeof dir, "%s/snapshots/%s", repo_dir, s[i].name) >= (int)sizeof dir)
            continue;
        if ((rc = snapshot_lacks(dir, &l, err))) break;
        if (i == 0) first = l;
        if (l.n) continue;
        if (snprintf(out, cap, "%s", dir) >= (int)cap) {
            rc = k3_fail(err, K3_ERR_IO, "%s: path too long", dir);
            break;
        }
        *found = true;
        if (i > 0 && note)
            snprintf(note, note_cap, "%s: the newest snapshot, %s, lacks %d file%s (%s%s); "
                     "using %s, the newest complete one", repo, s[0].name, first.n,
                     first.n == 1 ? "" : "s", first.names, first.n > LIST_MAX ? ", ..." : "",
                     s[i].name);
    }
    if (!rc && !*found) {
        char others[64] = "";
        if (n > 1)
            snprintf(others, sizeof others, " (%d older snapshot%s lack%s files too)", n - 1,
                     n == 2 ? "" : "s", n == 2 ? "s" : "");
        rc = k3_fail(err, K3_ERR_IO, "%s: no complete snapshot in the Hugging Face cache: the "
                     "newest, %s/snapshots/%s, lacks %d file%s: %s%s%s; finish the download, "
                     "or install it with k3 setup --repo %s (k3 setup --help says where)", repo,
                     repo_dir, s[0].name, first.n, first.n == 1 ? "" : "s", first.names,
                     first.n > LIST_MAX ? ", ..." : "", others, repo);
    }
    free(s);
    return rc;
}


/* ---- a pinned revision ---------------------------------------------------------------- */

/* The snapshot (a commit) that rev names in repo_dir: refs/REV's commit, else snapshots/REV,
 * else the one snapshot whose name begins with rev when rev is a short commit. commit = ""
 * when it names none (why says where it looked). Errors: K3_ERR_IO when refs/REV names a
 * commit without a snapshot; K3_ERR_USAGE when the short commit begins several snapshots. */
static int hub_commit(const char *name, const char *repo_dir, const char *rev, char *commit,
                      size_t cap, char *why, size_t why_cap, k3_err *err) {
    char p[PATH_MAX];
    struct stat st;
    read_ref(repo_dir, rev, commit, cap);
    if (commit[0]) {
        if (snprintf(p, sizeof p, "%s/snapshots/%s", repo_dir, commit) < (int)sizeof p &&
            stat(p, &st) == 0 && S_ISDIR(st.st_mode))
            return K3_OK;
        return k3_fail(err, K3_ERR_IO, "%s: %s/refs/%s names commit %s, which has no snapshot "
                       "(%s): finish the download, or install it with k3 setup %s", name,
                       repo_dir, rev, commit, p, name);
    }
    if (snprintf(p, sizeof p, "%s/snapshots/%s", repo_dir, rev) < (int)sizeof p &&
        stat(p, &st) == 0 && S_ISDIR(st.st_mode))
        return snprintf(commit, cap, "%s", rev), K3_OK;
    snprintf(why, why_cap, "no ref %s/refs/%s and no snapshot %s/snapshots/%s%s", repo_dir, rev,
             repo_dir, rev, commit_prefix(rev) ? "*" : "");
    if (!commit_prefix(rev)) return K3_OK;
    snap *s;
    int n, hits = 0, rc = list_snapshots(repo_dir, &s, &n, err);
    char both[2 * NAME_MAX + 8] = "";
    if (n) qsort(s, (size_t)n, sizeof *s, snap_name_cmp); /* the message's two, by name */
    for (int i = 0; i < n && !rc; i++) {
        if (strncmp(s[i].name, rev, strlen(rev))) continue;
        if (hits++ < 2) {
            size_t len = strlen(both);
            snprintf(both + len, sizeof both - len, "%s%s", len ? " and " : "", s[i].name);
        }
        snprintf(commit, cap, "%s", s[i].name);
    }
    free(s);
    if (!rc && hits > 1)
        rc = k3_fail(err, K3_ERR_USAGE, "%s: %s begins %d snapshots in %s/snapshots: %s%s; give "
                     "more of the commit", name, rev, hits, repo_dir, both,
                     hits > 2 ? ", ..." : "");
    return rc;
}

/* repo@rev in the hub cache: 0 with *found and out set; 0 with *found = false when the cache
 * has no such revision (why says where it looked); an error when rev names a snapshot that is
 * incomplete (never another revision instead), or an ambiguous short commit. */
static int from_hub_rev(const char *name, const char *repo, const char *rev, const char *hub,
                        char *out, size_t cap, bool *found, char *why, size_t why_cap,
                        k3_err *err) {
    char repo_dir[PATH_MAX], commit[NAME_MAX + 1], dir[PATH_MAX];
    *found = false;
    hub_repo_dir(repo_dir, sizeof repo_dir, hub, repo);
    int rc = hub_commit(name, repo_dir, rev, commit, sizeof commit, why, why_cap, err);
    if (rc || !commit[0]) return rc;
    if (snprintf(dir, sizeof dir, "%s/snapshots/%s", repo_dir, commit) >= (int)sizeof dir)
        return k3_fail(err, K3_ERR_IO, "%s: path too long", repo_dir);
    lack l;
    if ((rc = snapshot_lacks(dir, &l, err))) return rc;
    if (l.n)
        return k3_fail(err, K3_ERR_IO, "%s: the snapshot %s lacks %d file%s: %s%s; finish the "
                       "download, or install it with k3 setup %s (no other revision is used in "
                       "its place)", name, dir, l.n, l.n == 1 ? "" : "s", l.names,
                       l.n > LIST_MAX ? ", ..." : "", name);
    if (snprintf(out, cap, "%s", dir) >= (int)cap)
        return k3_fail(err, K3_ERR_IO, "%s: path too long", dir);
    *found = true;
    return K3_OK;
}

/* Whether the k3 setup install in dir holds repo at rev, by its manifest (.k3/setup.json): rev
 * is the revision it was asked for ("ref"), or the commit it pinned, or 7+ leading digits of
 * it. When not, why says what dir holds. Errors: a malformed manifest. */
static int install_holds(const char *dir, const char *repo, const char *rev, bool *yes,
                         char *why, size_t why_cap, k3_err *err) {
    sn_install in = {0};
    bool found;
    *yes = false;
    int rc = sn_manifest_read(dir, &in, &found, err);
    if (rc) return rc;
    if (!found)
        snprintf(why, why_cap, "%s has no record of its revision (no .k3/setup.json: not "
                 "installed by k3 setup)", dir);
    else if (strcmp(in.repo, repo))
        snprintf(why, why_cap, "%s holds %s", dir, in.repo);
    else if (!strcmp(in.ref, rev) || !strcmp(in.revision, rev) ||
             (commit_prefix(rev) && !strncmp(in.revision, rev, strlen(rev))))
        *yes = true;
    else
        snprintf(why, why_cap, "%s holds revision %s%s%s", dir, in.ref,
                 strcmp(in.ref, in.revision) ? ", commit " : "",
                 strcmp(in.ref, in.revision) ? in.revision : "");
    sn_install_free(&in);
    return K3_OK;
}

/* The install k3 setup made of repo (rev NULL) or of repo@rev: models/OWNER/NAME@REV, where
 * `k3 setup OWNER/NAME@REV` installs a revision other than main, then models/OWNER/NAME, each
 * taken for @REV only when its manifest records that revision. *found = false: why says what
 * each folder holds. */
static int from_models(const char *repo, const char *rev, const char *models, char *out,
                       size_t cap, bool *found, char *why, size_t why_cap, k3_err *err) {
    char dirs[2][PATH_MAX];
    int n = 0;
    *found = false;
    why[0] = 0;
    if (!models || !models[0])
        return snprintf(why, why_cap, "no k3 setup folder known (K3_MODELS, HOME unset)"), K3_OK;
    if (rev && !strchr(rev, '/'))
        snprintf(dirs[n++], PATH_MAX, "%s/%s@%s", models, repo, rev);
    snprintf(dirs[n++], PATH_MAX, "%s/%s", models, repo);
    for (int i = 0; i < n && !*found; i++) {
        char one[3 * PATH_MAX];
        bool has = present(dirs[i], "config.json"), yes = has && !rev;
        snprintf(one, sizeof one, "no install by k3 setup in %s", dirs[i]);
        if (has && rev) {
            int rc = install_holds(dirs[i], repo, rev, &yes, one, sizeof one, err);
            if (rc) return rc;
        }
        if (yes) {
            if (snprintf(out, cap, "%s", dirs[i]) >= (int)cap)
                return k3_fail(err, K3_ERR_IO, "%s: path too long", dirs[i]);
            *found = true;
        }
        size_t len = strlen(why);
        snprintf(why + len, why_cap - len, "%s%s", len ? "; " : "", one);
    }
    return K3_OK;
}

/* ---- the one door --------------------------------------------------------------------- */

int k3_model_resolve(const char *arg, const char *hub_cache, const char *models_dir, char *out,
                     size_t cap, char *note, size_t note_cap, k3_err *err) {
    struct stat st;
    char repo[256];
    const char *rev;
    if (note && note_cap) note[0] = 0;
    if (stat(arg, &st) == 0 || !split_name(arg, repo, sizeof repo, &rev)) { /* a path */
        if (snprintf(out, cap, "%s", arg) >= (int)cap)
            return k3_fail(err, K3_ERR_IO, "%s: path too long", arg);
        return K3_OK;
    }
    if (rev && !rev_ok(rev))
        return k3_fail(err, K3_ERR_USAGE, "%s: no such folder, and '%s' is no revision: give a "
                       "commit (all 40 hex digits, or 7 or more of its first), or a branch or tag "
                       "as OWNER/NAME@main or OWNER/NAME@refs/pr/1", arg, rev);
    char why_hub[2 * PATH_MAX + 96] = "no Hugging Face cache folder known (HF_HUB_CACHE, "
                                      "HF_HOME, HOME)", why_models[4 * PATH_MAX];
    bool found = false;
    int rc = K3_OK;
    if (hub_cache && hub_cache[0])
        rc = rev ? from_hub_rev(arg, repo, rev, hub_cache, out, cap, &found, why_hub,
                                sizeof why_hub, err)
                 : from_hub(repo, hub_cache, out, cap, &found, why_hub, sizeof why_hub, note,
                            note_cap, err);
    if (rc || found) return rc;
    if ((rc = from_models(repo, rev, models_dir, out, cap, &found, why_models,
                          sizeof why_models, err)) || found)
        return rc;
    if (rev)
        return k3_fail(err, K3_ERR_IO, "%s: no such folder, and as a Hugging Face repository id "
                       "at revision %s: %s; %s; install it with k3 setup %s, or download it "
                       "(hf download %s --revision %s), or give the snapshot's folder", arg,
                       rev, why_hub, why_models, arg, repo, rev);
    return k3_fail(err, K3_ERR_IO, "%s: no such folder, and as a Hugging Face repository id: "
                   "%s, and %s; download it with k3 setup --repo %s (into that folder), or give "
                   "the snapshot's folder", arg, why_hub, why_models, arg);
}
