/* test_arch.c — the architecture test: arrows point down (docs/ARCHITECTURE.md, "Layers").
 *
 * Scans every .c, .h and .cu file under src/ and fails when
 *  - a file includes a header of a layer that is not in its layer's allowed list (LAYERS
 *    below: one table, the same as the one in docs/ARCHITECTURE.md, which a test compares),
 *  - a file includes anything outside src/<layer>/ (tests/, ../../, an unknown folder),
 *  - a file includes another folder's internal header (INTERNAL) or a test-only header
 *    (TEST_ONLY) from outside its folder, or a lab-and-tests header (LAB_ONLY) from outside
 *    its folder and src/lab (the shipped k3 cannot reach the lab's controls),
 *  - a file below the edge (src/cli, src/server, src/lab) calls getenv: the library reads no
 *    environment; the edge turns variables into options,
 *  - a file calls what only some files may call (CALLS below: the one pass, issue 27): the
 *    forward pass outside the backend, the backend's pass outside the pass envelope
 *    (src/engine/pass.c), a prompt fed outside the one prefill path, a choice made by the
 *    backend's name (strcmp on k3_backend_name).
 * And the shipped ./k3 holds none of the server's test controls (K3_TEST_* names).
 * Only "quoted" includes are followed (<system> headers are not k3's); every include counts,
 * #ifdef'd or not. Comments and string literals are blanked before searching for getenv.
 *
 * EXEMPT lists the known violations that other work in progress removes (issue 15): the lead
 * deletes each entry when that work is merged. An entry that no longer matches anything fails
 * the test, so the list cannot outlive the violations it names. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

/* ---- the rules ----------------------------------------------------------------------------- */

/* Layers top to bottom; each may include its own folder and the layers listed (all of them
 * below it). edge: may read the environment. */
static const struct layer {
    const char *name, *may_include;
    bool edge;
} LAYERS[] = {
    {"lab", "cli dist server chat engine cuda model store setup kernels format tok util", true},
    {"cli", "dist server chat engine store setup kernels format tok util", true},
    {"dist", "engine model util", false},
    {"server", "chat engine tok util", true},
    {"chat", "tok util", false},
    {"engine", "cuda model store kernels format tok util", false},
    {"cuda", "model store kernels format util", false},
    {"model", "store kernels format util", false},
    {"store", "kernels format util", false},
    {"setup", "util", false},
    {"kernels", "util", false},
    {"format", "util", false},
    {"tok", "util", false},
    {"util", "", false},
};
#define N_LAYERS (sizeof LAYERS / sizeof LAYERS[0])

/* Headers only their own folder includes (a module's internals). */
static const char *const INTERNAL[] = {
    "src/model/state.h",        "src/model/batch.h",          "src/model/layers.h",
    "src/server/srv.h",         "src/cuda/kern.h",            "src/kernels/dispatch.h",
    "src/kernels/simd_dense.h", "src/kernels/simd_gemm.h",    "src/kernels/simd_mxgemm.h",
    "src/kernels/simd_vec.h",   "src/store/store_internal.h", "src/setup/setup_internal.h",
    "src/tok/tok_internal.h",
};
/* Headers for tests/ only (and the folder that implements them). */
static const char *const TEST_ONLY[] = {"src/engine/k3_test.h"};
/* Headers for tests/ and src/lab only (and the folder that implements them). */
static const char *const LAB_ONLY[] = {"src/engine/k3_lab.h"};

/* Known violations being removed by work in progress; "FILE -> LAYER" (an include) or
 * "FILE getenv", NULL-terminated. Empty now: issue 15's branches have landed. */
static const char *const EXEMPT[] = {NULL};
#define N_EXEMPT (sizeof EXEMPT / sizeof EXEMPT[0])

/* Calls only some files may make; a rule lists path prefixes ("src/model/" a folder,
 * "src/engine/pass.c" a file). The forward pass has one door (backend.h, k3_backend_pass), its
 * envelope lives in one file (src/engine/pass.c), and prompts go through the one prefill path
 * (k3_session_prefill_with and the server's rounds over k3_prefill_next). */
static const struct call_rule {
    const char *call, *only_in, *why;
} CALLS[] = {
    {"k3_forward", "src/model/ src/engine/backend.c", "the forward pass runs only in the backend "
     "(backend.h, k3_backend_pass): feed a session through k3_session_step / "
     "k3_session_forward / k3_multistep_run"},
    {"k3_forward_batch", "src/model/ src/engine/backend.c", "the forward pass runs only in the "
     "backend (backend.h, k3_backend_pass)"},
    {"k3_forward_multi", "src/model/ src/engine/backend.c", "the forward pass runs only in the "
     "backend (backend.h, k3_backend_pass)"},
    {"k3_gpu_step", "src/cuda/ src/engine/backend.c", "the GPU's step runs only in the backend "
     "(backend.h, k3_backend_pass)"},
    {"k3_backend_pass", "src/engine/pass.c src/engine/backend.", "the pass's envelope (checks, "
     "MPI mirror, SIGBUS, reset, logits check) is src/engine/pass.c's alone: call "
     "k3_engine_pass"},
    {"k3_sigbus_arm", "src/engine/pass.c src/util/", "a pass is armed in src/engine/pass.c only"},
    {"k3_session_forward", "src/engine/ src/dist/ src/lab/", "prompts are fed through the one "
     "prefill path (k3_session_prefill_with, or k3_prefill_* in a caller's own passes)"},
    {"k3_session_step", "src/engine/ src/dist/ src/lab/ src/cli/", "the server feeds its "
     "sessions through its rounds' one pass (k3_multistep_run)"},
};

/* The lab times the GPU kernels directly: it alone may include the CUDA kernels' header. */
static bool lab_may_include(const struct layer *own, const char *target) {
    return !strcmp(own->name, "lab") && !strcmp(target, "src/cuda/kern.h");
}

/* ---- the checker --------------------------------------------------------------------------- */

typedef struct report {
    char text[16384];
    size_t len;
    int n;                       /* violations */
    bool use_exempt;             /* the real tree: EXEMPT applies */
    bool exempt_used[N_EXEMPT];
} report;

static void add(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(report *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (r->len < sizeof r->text) {
        int n = vsnprintf(r->text + r->len, sizeof r->text - r->len, fmt, ap);
        if (n > 0) r->len += (size_t)n;
        if (r->len >= sizeof r->text) r->len = sizeof r->text - 1;
    }
    va_end(ap);
    r->n++;
}

static const struct layer *layer_named(const char *name, size_t len) {
    for (size_t i = 0; i < N_LAYERS; i++)
        if (strlen(LAYERS[i].name) == len && !strncmp(LAYERS[i].name, name, len)) return &LAYERS[i];
    return NULL;
}

static bool word_in(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || !p[n])) return true;
    return false;
}

static bool listed(const char *const *list, size_t n, const char *path) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], path)) return true;
    return false;
}

/* True (and marks the entry used) when "path what" is exempt. */
static bool exempt(report *r, const char *path, const char *what) {
    if (!r->use_exempt) return false;
    char key[600];
    snprintf(key, sizeof key, "%s %s", path, what);
    for (size_t i = 0; EXEMPT[i]; i++)
        if (!strcmp(EXEMPT[i], key)) return r->exempt_used[i] = true;
    return false;
}

/* Normalises "src/engine/../cuda/gpu.h" to "src/cuda/gpu.h" in place; false when it climbs
 * above the root. */
static bool normalise(char *p) {
    char *seg[64], *out = p;
    int n = 0;
    for (char *s = strtok(p, "/"); s; s = strtok(NULL, "/")) {
        if (!strcmp(s, ".")) continue;
        if (!strcmp(s, "..")) {
            if (!n) return false;
            n--;
            continue;
        }
        if (n == 64) return false;
        seg[n++] = s;
    }
    char buf[1024] = "";
    for (int i = 0; i < n; i++) {
        strncat(buf, seg[i], sizeof buf - strlen(buf) - 1);
        if (i + 1 < n) strncat(buf, "/", sizeof buf - strlen(buf) - 1);
    }
    strcpy(out, buf);
    return true;
}

/* The layer of a root-relative path "src/NAME/...", or NULL (len receives NAME's length). */
static const char *layer_of(const char *path, size_t *len) {
    if (strncmp(path, "src/", 4)) return NULL;
    const char *name = path + 4, *slash = strchr(name, '/');
    if (!slash) return NULL;
    *len = (size_t)(slash - name);
    return name;
}

/* Blanks comments (and, with strings, string and character literals) with spaces, keeping
 * newlines, so that line numbers stay right. */
static void blank(char *s, bool strings) {
    enum { CODE, LINE, BLOCK, STR, CHR } st = CODE;
    for (char *p = s; *p; p++) {
        switch (st) {
        case CODE:
            if (p[0] == '/' && p[1] == '/') st = LINE, *p = ' ';
            else if (p[0] == '/' && p[1] == '*') st = BLOCK, *p++ = ' ', *p = ' ';
            else if (strings && *p == '"') st = STR;
            else if (strings && *p == '\'') st = CHR;
            break;
        case LINE:
            if (*p == '\n') st = CODE;
            else *p = ' ';
            break;
        case BLOCK:
            if (p[0] == '*' && p[1] == '/') st = CODE, *p++ = ' ', *p = ' ';
            else if (*p != '\n') *p = ' ';
            break;
        case STR:
        case CHR:
            if (*p == '\\' && p[1]) *p++ = ' ', *p = *p == '\n' ? '\n' : ' ';
            else if (*p == (st == STR ? '"' : '\'')) st = CODE;
            else if (*p != '\n') *p = ' ';
            break;
        }
    }
}

static int line_at(const char *s, const char *p) {
    int n = 1;
    for (; s < p; s++) n += *s == '\n';
    return n;
}

static void check_includes(report *r, const char *path, const struct layer *own, char *text) {
    blank(text, false);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    for (char *p = text; (p = strchr(p, '#')); p++) {
        const char *b = p;
        while (b > text && (b[-1] == ' ' || b[-1] == '\t')) b--;
        if (b > text && b[-1] != '\n') continue; /* a directive starts its line */
        char *q = p + 1;
        while (*q == ' ' || *q == '\t') q++;
        if (strncmp(q, "include", 7)) continue;
        q += 7;
        while (*q == ' ' || *q == '\t') q++;
        if (*q != '"') continue;
        char *end = strchr(q + 1, '"');
        if (!end) continue;
        char inc[1024], target[2100];
        snprintf(inc, sizeof inc, "%.*s", (int)(end - q - 1), q + 1);
        snprintf(target, sizeof target, "%s/%s", dir, inc);
        int line = line_at(text, p);
        size_t len = 0;
        const char *name = normalise(target) ? layer_of(target, &len) : NULL;
        const struct layer *to = name ? layer_named(name, len) : NULL;
        if (!to) {
            add(r, "%s:%d: includes \"%s\", outside src/<layer>/ (product code never includes "
                "tests/ or a folder missing from the layer table)\n", path, line, inc);
            continue;
        }
        bool same = to == own;
        size_t tl = strlen(target);
        bool internal = (listed(INTERNAL, sizeof INTERNAL / sizeof *INTERNAL, target) ||
                         (tl > 11 && !strcmp(target + tl - 11, "_internal.h"))) &&
                        !lab_may_include(own, target);
        if (!same && internal)
            add(r, "%s:%d: includes %s, internal to src/%s\n", path, line, target, to->name);
        if (!same && listed(TEST_ONLY, sizeof TEST_ONLY / sizeof *TEST_ONLY, target))
            add(r, "%s:%d: includes %s, a header for tests only\n", path, line, target);
        if (!same && strcmp(own->name, "lab") &&
            listed(LAB_ONLY, sizeof LAB_ONLY / sizeof *LAB_ONLY, target))
            add(r, "%s:%d: includes %s, a header for the lab and tests only\n", path, line,
                target);
        char what[64];
        snprintf(what, sizeof what, "-> %s", to->name);
        if (!same && !word_in(own->may_include, to->name) && !exempt(r, path, what))
            add(r, "%s:%d: %s includes %s (layer %s): %s may include only: %s\n", path, line,
                own->name, target, to->name, own->name,
                *own->may_include ? own->may_include : "(nothing)");
    }
}

static void check_env(report *r, const char *path, const struct layer *own, char *text) {
    if (own->edge) return;
    blank(text, true);
    for (char *p = text; (p = strstr(p, "getenv")); p += 6) {
        bool ident = p > text && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') ||
                                  (p[-1] >= 'A' && p[-1] <= 'Z') || (p[-1] >= '0' && p[-1] <= '9'));
        if (ident && (p - text < 7 || strncmp(p - 7, "secure_", 7))) continue; /* my_getenv */
        char *q = p + 6;
        while (*q == ' ' || *q == '\t') q++;
        if (*q != '(') continue;
        if (exempt(r, path, "getenv")) return;
        add(r, "%s:%d: %s calls getenv: below the edge (src/cli, src/server, src/lab) the "
            "library reads no environment; take the value as an option\n", path,
            line_at(text, p), own->name);
    }
}

static bool ident_char(char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

static bool allowed_in(const char *list, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *w = strtok(buf, " "); w; w = strtok(NULL, " "))
        if (!strncmp(path, w, strlen(w))) return true;
    return false;
}

/* CALLS (text blanked of comments and strings), and no strcmp on k3_backend_name. */
static void check_calls(report *r, const char *path, const char *text) {
    for (size_t i = 0; i < sizeof CALLS / sizeof *CALLS; i++) {
        const struct call_rule *c = &CALLS[i];
        size_t n = strlen(c->call);
        if (allowed_in(c->only_in, path)) continue;
        for (const char *p = text; (p = strstr(p, c->call)); p += n) {
            if ((p > text && ident_char(p[-1])) || ident_char(p[n])) continue;
            const char *q = p + n;
            while (*q == ' ' || *q == '\t') q++;
            if (*q != '(') continue;
            add(r, "%s:%d: calls %s, which only %s may call: %s\n", path, line_at(text, p),
                c->call, c->only_in, c->why);
        }
    }
    for (const char *p = text; (p = strstr(p, "k3_backend_name")); p++) {
        const char *b = p;
        while (b > text && (b[-1] == ' ' || b[-1] == '(' || b[-1] == '!')) b--;
        if (b - text >= 6 && !strncmp(b - 6, "strcmp", 6))
            add(r, "%s:%d: compares k3_backend_name: no caller decides by the backend's name "
                "(ask the backend: k3_backend_can_rewind, or let k3_backend_pass choose)\n",
                path, line_at(text, p));
    }
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static bool source_name(const char *n) {
    size_t l = strlen(n);
    return (l > 2 && (!strcmp(n + l - 2, ".c") || !strcmp(n + l - 2, ".h"))) ||
           (l > 3 && !strcmp(n + l - 3, ".cu"));
}

/* Checks root/src/ (files named relative to root); returns the number of violations. */
static int arch_check(const char *root, report *r) {
    char src[1024];
    snprintf(src, sizeof src, "%s/src", root);
    DIR *top = opendir(src);
    if (!top) {
        add(r, "%s: cannot open: %s\n", src, strerror(errno));
        return r->n;
    }
    for (struct dirent *d; (d = readdir(top));) {
        if (d->d_name[0] == '.') continue;
        const struct layer *own = layer_named(d->d_name, strlen(d->d_name));
        char sub[1280];
        snprintf(sub, sizeof sub, "%s/%s", src, d->d_name);
        struct stat st;
        if (stat(sub, &st) || !S_ISDIR(st.st_mode)) continue;
        if (!own) {
            add(r, "src/%s: a folder that is not in the layer table (tests/test_arch.c LAYERS "
                "and docs/ARCHITECTURE.md)\n", d->d_name);
            continue;
        }
        DIR *dir = opendir(sub);
        for (struct dirent *f; dir && (f = readdir(dir));) {
            if (!source_name(f->d_name)) continue;
            char full[1600], rel[520];
            snprintf(full, sizeof full, "%s/%s", sub, f->d_name);
            snprintf(rel, sizeof rel, "src/%s/%s", d->d_name, f->d_name);
            char *a = slurp(full), *b = a ? strdup(a) : NULL, *c = a ? strdup(a) : NULL;
            if (a && b && c) {
                check_includes(r, rel, own, a);
                check_env(r, rel, own, b);
                blank(c, true);
                check_calls(r, rel, c);
            } else {
                add(r, "%s: cannot read\n", rel);
            }
            free(a);
            free(b);
            free(c);
        }
        if (dir) closedir(dir);
    }
    closedir(top);
    return r->n;
}

/* ---- tests ----------------------------------------------------------------------------------- */

static void test_tree_follows_the_layers(void) {
    report *r = calloc(1, sizeof *r);
    CHECK(r, "out of memory");
    r->use_exempt = true;
    arch_check(".", r);
    for (size_t i = 0; EXEMPT[i]; i++)
        if (!r->exempt_used[i])
            add(r, "EXEMPT \"%s\" matches nothing any more: delete it from tests/test_arch.c\n",
                EXEMPT[i]);
    int n = r->n;
    if (n) fprintf(stderr, "%s", r->text);
    free(r);
    CHECK(n == 0, "%d architecture violation(s), listed above", n);
}

static void put(const char *root, const char *rel, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char *slash = strrchr(path, '/');
    *slash = 0;
    char *p = path + strlen(root);
    while ((p = strchr(p + 1, '/'))) { /* mkdir -p */
        *p = 0;
        mkdir(path, 0755);
        *p = '/';
    }
    mkdir(path, 0755);
    *slash = '/';
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st)) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_rf(sub);
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* A planted tree: each rule fails on its violation, and the allowed forms pass. */
static void test_planted_violations_fail(void) {
    char root[] = "/tmp/k3_arch_XXXXXX";
    CHECK(mkdtemp(root), "mkdtemp: %s", strerror(errno));
    /* allowed: own folder, a lower layer, getenv in a comment or a string, the edge */
    put(root, "src/util/err.h", "/* getenv(\"X\") in a comment is no call */\n");
    put(root, "src/kernels/ok.c", "#include \"ok.h\"\n#include \"../util/err.h\"\n"
        "#include <stdlib.h>\nconst char *s = \"getenv(\";\n");
    put(root, "src/kernels/ok.h", "\n");
    put(root, "src/cli/main.c", "#include \"../engine/k3.h\"\nint f(void) { "
        "return getenv(\"K3_X\") != 0; }\n");
    put(root, "src/engine/k3.h", "#include \"../util/err.h\"\n");
    report *r = calloc(1, sizeof *r);
    CHECK(r, "out of memory");
    int clean = arch_check(root, r);
    char clean_text[sizeof r->text];
    snprintf(clean_text, sizeof clean_text, "%s", r->text);
    /* planted: an upward include, an include of tests/, an internal header of another
     * folder, getenv below the edge, a folder missing from the table, a test-only header in
     * product code, and an include of the CLI */
    put(root, "src/kernels/up.c", "#include \"dispatch.h\"\n\n#include \"../engine/k3.h\"\n");
    put(root, "src/format/t.c", "#include \"../../tests/simde_avx512.h\"\n");
    put(root, "src/engine/e.c", "#  include \"../model/state.h\"\n");
    put(root, "src/model/env.c", "#include <stdlib.h>\nint f(void) {\n"
        "    return getenv (\"K3_X\") != 0;\n}\n");
    put(root, "src/extra/x.c", "\n");
    put(root, "src/cli/t.c", "#include \"../engine/k3_test.h\"\n");
    put(root, "src/server/s.c", "#include \"../cli/cli.h\"\n");
    put(root, "src/cli/lab.c", "#include \"../engine/k3_lab.h\"\n");
    put(root, "src/lab/ok.c", "#include \"../engine/k3_lab.h\"\n");
    memset(r, 0, sizeof *r);
    int planted = arch_check(root, r);
    rm_rf(root);
    char text[16384];
    snprintf(text, sizeof text, "%s", r->text);
    free(r);
    CHECK(clean == 0, "the allowed forms were refused: %s", clean_text);
    CHECK(planted == 8, "%d violations, expected 8: %s", planted, text);
    CHECK(strstr(text, "src/cli/lab.c:1: includes src/engine/k3_lab.h, a header for the lab "
                 "and tests only"), "%s", text);
    CHECK(strstr(text, "src/kernels/up.c:3: kernels includes src/engine/k3.h (layer engine): "
                 "kernels may include only: util"), "%s", text);
    CHECK(strstr(text, "src/format/t.c:1: includes \"../../tests/simde_avx512.h\", outside"),
          "%s", text);
    CHECK(strstr(text, "src/engine/e.c:1: includes src/model/state.h, internal to src/model"),
          "%s", text);
    CHECK(strstr(text, "src/model/env.c:3: model calls getenv"), "%s", text);
    CHECK(strstr(text, "src/extra: a folder that is not in the layer table"), "%s", text);
    CHECK(strstr(text, "src/cli/t.c:1: includes src/engine/k3_test.h, a header for tests only"),
          "%s", text);
    CHECK(strstr(text, "src/server/s.c:1: server includes src/cli/cli.h (layer cli)"), "%s",
          text);
}

/* The call rules: the forward pass outside the backend, the backend's pass outside pass.c,
 * a prompt fed by hand in the server, a backend-name test each fail; the allowed forms pass. */
static void test_planted_pass_violations_fail(void) {
    char root[] = "/tmp/k3_arch_XXXXXX";
    CHECK(mkdtemp(root), "mkdtemp: %s", strerror(errno));
    put(root, "src/model/forward.c", "int k3_forward(int x) { return x; }\n");
    put(root, "src/engine/backend.c", "int b(void) { return k3_forward_multi(1); }\n");
    put(root, "src/engine/pass.c", "int p(void) { k3_sigbus_arm(); return k3_backend_pass(0); }\n");
    put(root, "src/server/ok.c", "/* k3_forward(x) in a comment */ const char *s = "
        "\"k3_session_forward(\"; int k3_forward_ok(void);\n");
    report *r = calloc(1, sizeof *r);
    CHECK(r, "out of memory");
    int clean = arch_check(root, r);
    char clean_text[sizeof r->text];
    snprintf(clean_text, sizeof clean_text, "%s", r->text);
    put(root, "src/engine/multistep.c", "int m(void) {\n  return k3_forward_multi(0);\n}\n");
    put(root, "src/engine/engine.c", "int s(void) { return k3_backend_pass(0); }\n");
    put(root, "src/server/sched.c", "int f(void) { return k3_session_forward (0); }\n");
    put(root, "src/cli/run.c", "int g(void) { return !strcmp(k3_backend_name(b), \"cpu\"); }\n");
    memset(r, 0, sizeof *r);
    int planted = arch_check(root, r);
    rm_rf(root);
    char text[16384];
    snprintf(text, sizeof text, "%s", r->text);
    free(r);
    CHECK(clean == 0, "the allowed forms were refused: %s", clean_text);
    CHECK(planted == 4, "%d violations, expected 4: %s", planted, text);
    CHECK(strstr(text, "src/engine/multistep.c:2: calls k3_forward_multi, which only src/model/ "
                 "src/engine/backend.c may call"), "%s", text);
    CHECK(strstr(text, "src/engine/engine.c:1: calls k3_backend_pass"), "%s", text);
    CHECK(strstr(text, "src/server/sched.c:1: calls k3_session_forward"), "%s", text);
    CHECK(strstr(text, "src/cli/run.c:1: compares k3_backend_name"), "%s", text);
}

/* The shipped k3 (K3_BIN, default ./k3) holds none of the server's test controls: they are
 * compiled only into the test build (server.h, k3_server_test_control; build/k3-test). */
static void test_shipped_k3_has_no_test_controls(void) {
    const char *bin = getenv("K3_BIN") ? getenv("K3_BIN") : "./k3";
    FILE *f = fopen(bin, "rb");
    CHECK(f, "%s: %s (make k3 first)", bin, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n > 0 ? malloc((size_t)n) : NULL;
    bool ok = b && fread(b, 1, (size_t)n, f) == (size_t)n;
    fclose(f);
    CHECK(ok, "%s: cannot read", bin);
    static const char *const names[] = {"K3_TEST_SCRIPTED_REPLY", "K3_TEST_TOKEN_DELAY_MS",
                                        "K3_TEST_STREAM_BACKLOG_BYTES", "K3_TEST_PASS_HOLD_S",
                                        "K3_TEST_PASS_HOLD_POS", "k3_server_test_control"};
    const char *found = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !found; i++)
        if (memmem(b, (size_t)n, names[i], strlen(names[i]))) found = names[i];
    free(b);
    CHECK(!found, "%s holds %s: the server's test controls belong in the test build only "
          "(-DK3_TEST_CONTROLS)", bin, found);
}

/* docs/ARCHITECTURE.md's table states the same rules: one row per layer,
 * "| `name` | `a` `b` ... | edge? | ...". */
static void test_doc_table_matches(void) {
    char *doc = slurp("docs/ARCHITECTURE.md");
    CHECK(doc, "docs/ARCHITECTURE.md: cannot read");
    int rows = 0;
    char msg[1024] = "";
    for (char *line = doc, *next; line && *line && !*msg; line = next) {
        next = strchr(line, '\n');
        if (next) next++;
        if (strncmp(line, "| `", 3)) continue;
        char *name = line + 3, *tick = strchr(name, '`');
        char *eol = strchr(line, '\n');
        if (!tick || (eol && tick > eol)) continue;
        const struct layer *l = layer_named(name, (size_t)(tick - name));
        if (!l) continue;
        char *col = strchr(tick, '|'), *col2 = col ? strchr(col + 1, '|') : NULL;
        char *col3 = col2 ? strchr(col2 + 1, '|') : NULL;
        if (!col2 || !col3 || (eol && col3 > eol)) {
            snprintf(msg, sizeof msg, "row of %s: expected | layer | may include | edge |",
                     l->name);
            break;
        }
        char got[256] = "";
        for (char *p = col + 1; p < col2; p++) {
            if (*p != '`') continue;
            char *q = strchr(p + 1, '`');
            if (!q || q > col2) break;
            if (*got) strncat(got, " ", sizeof got - strlen(got) - 1);
            strncat(got, p + 1, (size_t)(q - p - 1) < sizeof got - strlen(got) - 1
                                    ? (size_t)(q - p - 1) : sizeof got - strlen(got) - 1);
            p = q;
        }
        bool edge = false;
        for (char *p = col2 + 1; p < col3; p++)
            if (!strncmp(p, "yes", 3)) edge = true;
        if (strcmp(got, l->may_include) || edge != l->edge)
            snprintf(msg, sizeof msg, "docs/ARCHITECTURE.md row %s: may include \"%s\", edge %d; "
                     "tests/test_arch.c: \"%s\", edge %d", l->name, got, edge, l->may_include,
                     l->edge);
        rows++;
    }
    free(doc);
    CHECK(!*msg, "%s", msg);
    CHECK(rows == (int)N_LAYERS, "docs/ARCHITECTURE.md has %d layer rows, the test %zu", rows,
          N_LAYERS);
}

const k3_test k3_suite_arch[] = {
    {"tree_follows_the_layers", test_tree_follows_the_layers},
    {"planted_violations_fail", test_planted_violations_fail},
    {"doc_table_matches_the_test", test_doc_table_matches},
    {"planted_pass_violations_fail", test_planted_pass_violations_fail},
    {"shipped_k3_has_no_test_controls", test_shipped_k3_has_no_test_controls},
    {0},
};
