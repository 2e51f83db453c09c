/* cmd_tokenize.c — `k3 tokenize` (text → comma-separated ids) and `k3 detokenize` (ids →
 * text). Both need only DIR/tiktoken.model and DIR/tokenizer_config.json; DIR defaults to
 * the bundled fixture model. The first positional argument is DIR when it is a folder that
 * holds tiktoken.model, otherwise it is the TEXT/IDS argument. */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../setup/setup.h"
#include "../tok/tokenizer.h"
#include "../util/fileio.h"
#include "cli.h"
#include "idlist.h"

#define MAX_FILE_BYTES ((size_t)1 << 30)

static void tokenize_usage(FILE *f) {
    fprintf(f,
        "usage: k3 tokenize [DIR] [--special] (--file PATH | TEXT)\n"
        "\n"
        "Prints the token ids of TEXT (UTF-8) on one line, comma-separated. No [BOS] is added.\n"
        "DIR holds tiktoken.model and tokenizer_config.json (default: the bundled fixture\n"
        "model).\n"
        "\n"
        "  --special      special-token spellings such as <|open|> or [BOS] become their ids\n"
        "                 (default: they are ordinary text, as in user content)\n"
        "  --file PATH    tokenize the exact bytes of PATH instead of TEXT (- reads stdin)\n"
        "  --             end of options (for a TEXT that starts with '-')\n"
        "  -h, --help     this help\n");
}

static void detokenize_usage(FILE *f) {
    fprintf(f,
        "usage: k3 detokenize [DIR] (--file PATH | IDS)\n"
        "\n"
        "Prints the text of IDS (token ids separated by commas and/or spaces, as k3 tokenize\n"
        "prints them) followed by a newline. Bytes that are not valid UTF-8 print as U+FFFD;\n"
        "special ids print as their spelling. DIR holds tiktoken.model and\n"
        "tokenizer_config.json (default: the bundled fixture model).\n"
        "\n"
        "  --file PATH    read the ids from PATH (commas, spaces or newlines between them;\n"
        "                 - reads stdin, e.g. k3 tokenize TEXT | k3 detokenize --file -)\n"
        "  -h, --help     this help\n"
        "\n"
        "Exit status 2 for an item that is not an id, 7 for an id outside the vocabulary\n"
        "(the message gives the id, the vocabulary size and, for --file, the line).\n");
}

static int usage_error(const char *cmd, const char *what, const char *arg) {
    fprintf(stderr, "k3 %s: %s%s%s (see k3 %s --help)\n", cmd, what, arg ? ": " : "",
            arg ? arg : "", cmd);
    return K3_ERR_USAGE;
}

static bool is_tokenizer_dir(const char *path) {
    char p[PATH_MAX];
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    return stat(k3_path_join(p, sizeof p, path, "tiktoken.model"), &st) == 0;
}

/* ---- argument parsing ---------------------------------------------------------------- */

typedef struct tok_args {
    const char *dir, *arg, *file; /* arg: TEXT or IDS */
    bool special;
} tok_args;

/* What is wrong with `rest` positionals after DIR, or NULL. */
static const char *arity_problem(bool has_file, int rest, bool with_options) {
    if (has_file) return rest ? (with_options ? "--file and TEXT both given"
                                              : "--file and IDS both given") : NULL;
    if (rest == 0) return with_options ? "missing TEXT (or --file PATH)"
                                       : "missing IDS (or --file PATH)";
    return rest > 1 ? "too many arguments, or DIR has no tiktoken.model" : NULL;
}

/* Parses [DIR] [options] ARG; --file for both, with_options enables --special (tokenize
 * only). Returns 0, -1 after printing help, or K3_ERR_USAGE. */
static int parse_args(int argc, char **argv, bool with_options, tok_args *a) {
    const char *cmd = argv[0], *pos[3];
    int n_pos = 0;
    bool opts_done = false;
    *a = (tok_args){0};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool is_opt = !opts_done && s[0] == '-' && s[1] != 0;
        if (!is_opt && n_pos == 2) return usage_error(cmd, "too many arguments", s);
        if (!is_opt) pos[n_pos++] = s;
        else if (!strcmp(s, "--")) opts_done = true;
        else if (!strcmp(s, "-h") || !strcmp(s, "--help")) return -1;
        else if (with_options && !strcmp(s, "--special")) a->special = true;
        else if (!strcmp(s, "--file") && i + 1 < argc) a->file = argv[++i];
        else return usage_error(cmd, "unknown option or missing value", s);
    }
    int first = 0;
    if (n_pos > 0 && is_tokenizer_dir(pos[0])) a->dir = pos[first++];
    else if (n_pos > (a->file ? 0 : 1) && k3_repo_id_valid(pos[0])) { /* a model's name */
        int rc = k3_model_arg(cmd, pos[first++], &a->dir);
        if (rc) return rc;
    }
    const char *problem = arity_problem(a->file != NULL, n_pos - first, with_options);
    if (problem) return usage_error(cmd, problem, NULL);
    if (!a->file) a->arg = pos[first];
    if (!a->dir) a->dir = k3_default_model_dir();
    return 0;
}

/* ---- k3 tokenize --------------------------------------------------------------------- */

static void print_ids(const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    putchar('\n');
}

static int fail(const char *cmd, const k3_err *err) {
    fprintf(stderr, "k3 %s: %s\n", cmd, err->msg);
    return err->code;
}

/* --file PATH: the whole file, or stdin for "-" (k3_read_file takes regular files only, so
 * that a FIFO cannot hang it; stdin is read to its end). *name is what messages call it. */
static int read_input(const char *path, char **out, size_t *len, const char **name,
                      k3_err *err) {
    *name = path;
    if (strcmp(path, "-")) return k3_read_file(path, MAX_FILE_BYTES, out, len, err);
    *name = "stdin";
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p && n < MAX_FILE_BYTES) {
        n += fread(p + n, 1, cap - n - 1, stdin);
        if (n < cap - 1) break;
        char *q = realloc(p, cap *= 2);
        if (!q) free(p);
        p = q;
    }
    if (!p) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (ferror(stdin) || n >= MAX_FILE_BYTES) {
        free(p);
        return k3_fail(err, K3_ERR_IO, "stdin: %s", n >= MAX_FILE_BYTES ? "more than 1 GiB"
                       : "read failed");
    }
    p[n] = 0;
    *out = p;
    *len = n;
    return K3_OK;
}

int k3_cmd_tokenize(int argc, char **argv) {
    tok_args a;
    int rc = parse_args(argc, argv, true, &a);
    if (rc) return rc < 0 ? (tokenize_usage(stdout), 0) : rc;
    k3_err err = {0};
    char *file_text = NULL;
    size_t len = a.arg ? strlen(a.arg) : 0, n;
    const char *name;
    if (a.file && read_input(a.file, &file_text, &len, &name, &err) != K3_OK)
        return fail("tokenize", &err);
    k3_tokenizer *t = NULL;
    int32_t *ids = NULL;
    if (k3_tokenizer_load(a.dir, &t, &err) == K3_OK &&
        k3_tokenizer_encode(t, a.file ? file_text : a.arg, len, a.special, &ids, &n, &err) ==
            K3_OK)
        print_ids(ids, n);
    free(ids);
    free(file_text);
    k3_tokenizer_free(t);
    return err.code ? fail("tokenize", &err) : 0;
}

/* ---- k3 detokenize ------------------------------------------------------------------- */

int k3_cmd_detokenize(int argc, char **argv) {
    tok_args a;
    int rc = parse_args(argc, argv, false, &a);
    if (rc) return rc < 0 ? (detokenize_usage(stdout), 0) : rc;
    int32_t *ids = NULL;
    size_t n = 0, len = a.arg ? strlen(a.arg) : 0;
    k3_err err = {0};
    k3_tokenizer *t = NULL;
    char *text = NULL, *file_text = NULL;
    const char *name = "IDS";
    if (a.file && read_input(a.file, &file_text, &len, &name, &err) != K3_OK)
        return fail("detokenize", &err);
    if (k3_tokenizer_load(a.dir, &t, &err) == K3_OK &&
        k3_cli_parse_ids(a.file ? file_text : a.arg, len, name, a.file != NULL,
                         k3_tokenizer_vocab_size(t), &ids, &n, &err) == K3_OK &&
        k3_tokenizer_decode(t, ids, n, &text, &len, &err) == K3_OK) {
        fwrite(text, 1, len, stdout);
        putchar('\n');
    }
    free(text);
    free(ids);
    free(file_text);
    k3_tokenizer_free(t);
    return err.code ? fail("detokenize", &err) : 0;
}
