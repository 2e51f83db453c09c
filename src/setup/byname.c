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
#include "setup.h"

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
    char ref[128] = "", *txt = NULL;
    k3_err ignored;
    if (snprintf(p, sizeof p, "%s/refs/main", repo_dir) < (int)sizeof p &&
        !k3_read_file(p, 256, &txt, NULL, &ignored)) {
        snprintf(ref, sizeof ref, "%.*s", (int)strcspn(txt, " \r\n"), txt);
        free(txt);
    }
    for (int i = 1; i < *n && ref[0]; i++)
        if (!strcmp((*out)[i].name, ref)) {
            snap s = (*out)[i];
            memmove(*out + 1, *out, (size_t)i * sizeof **out);
            (*out)[0] = s;
        }
    return K3_OK;
}

/* The newest complete snapshot of repo in the hub cache: 0 with *found = true and out set;
 * 0 with *found = false when the cache has no snapshot of it (why in `why`); an error when
 * it has snapshots and none is complete (the message names what the newest lacks). */
static int from_hub(const char *repo, const char *hub, char *out, size_t cap, bool *found,
                    char *why, size_t why_cap, char *note, size_t note_cap, k3_err *err) {
    char repo_dir[PATH_MAX];
    size_t slash = strcspn(repo, "/");
    *found = false;
    snprintf(repo_dir, sizeof repo_dir, "%s/models--%.*s--%s", hub, (int)slash, repo,
             repo + slash + 1);
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

/* ---- the one door --------------------------------------------------------------------- */

int k3_model_resolve(const char *arg, const char *hub_cache, const char *models_dir, char *out,
                     size_t cap, char *note, size_t note_cap, k3_err *err) {
    struct stat st;
    if (note && note_cap) note[0] = 0;
    if (stat(arg, &st) == 0 || !k3_repo_id_valid(arg)) { /* a path, as given */
        if (snprintf(out, cap, "%s", arg) >= (int)cap)
            return k3_fail(err, K3_ERR_IO, "%s: path too long", arg);
        return K3_OK;
    }
    char why[PATH_MAX + 96] = "no Hugging Face cache folder known (HF_HUB_CACHE, HF_HOME, HOME)";
    if (hub_cache && hub_cache[0]) {
        bool found;
        int rc = from_hub(arg, hub_cache, out, cap, &found, why, sizeof why, note, note_cap, err);
        if (rc || found) return rc;
    }
    char dir[PATH_MAX];
    if (models_dir && models_dir[0] &&
        snprintf(dir, sizeof dir, "%s/%s", models_dir, arg) < (int)sizeof dir &&
        present(dir, "config.json")) {
        if (snprintf(out, cap, "%s", dir) >= (int)cap)
            return k3_fail(err, K3_ERR_IO, "%s: path too long", dir);
        return K3_OK;
    }
    return k3_fail(err, K3_ERR_IO, "%s: no such folder, and as a Hugging Face repository id: "
                   "%s, and no install by k3 setup in %s/%s; download it with k3 setup --repo "
                   "%s (into that folder), or give the snapshot's folder", arg, why,
                   models_dir && models_dir[0] ? models_dir : "(K3_MODELS, HOME unset)", arg,
                   arg);
}
