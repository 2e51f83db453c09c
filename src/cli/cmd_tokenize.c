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
#include "opts.h"

#define MAX_FILE_BYTES ((size_t)1 << 30)

typedef struct tok_args {
    const char *dir, *arg, *file; /* arg: TEXT or IDS */
    bool special;
} tok_args;

#define TOK(f) K3_OPT_CMD(tok_args, f), .field = #f
static const k3_opt tokenize_rows[] = {
    {.flag = "--special", TOK(special), .type = K3_OPT_SWITCH, .value = 1,
     .help = "special-token spellings such as <|open|> or [BOS] become their ids\n"
             "(default: they are ordinary text, as in user content)"},
    {.flag = "--file", TOK(file), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY, .meta = "PATH",
     .help = "tokenize the exact bytes of PATH instead of TEXT (- reads stdin)"},
};
static const k3_opt detokenize_rows[] = {
    {.flag = "--file", TOK(file), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY, .meta = "PATH",
     .help = "read the ids from PATH (commas, spaces or newlines between them; - reads\n"
             "stdin, e.g. k3 tokenize TEXT | k3 detokenize --file -)"},
};

static const k3_cli_command tokenize_cmd = {
    .name = "tokenize",
    .usage =
        "usage: k3 tokenize [DIR] [--special] (--file PATH | TEXT)\n"
        "\n"
        "Prints the token ids of TEXT (UTF-8) on one line, comma-separated. No [BOS] is added.\n"
        "DIR holds tiktoken.model and tokenizer_config.json (default: the bundled fixture\n"
        "model).\n",
    .rows = tokenize_rows, .n_rows = sizeof tokenize_rows / sizeof *tokenize_rows,
    .max_positional = 2, .end_of_options = 1,
};
static const k3_cli_command detokenize_cmd = {
    .name = "detokenize",
    .usage =
        "usage: k3 detokenize [DIR] (--file PATH | IDS)\n"
        "\n"
        "Prints the text of IDS (token ids separated by commas and/or spaces, as k3 tokenize\n"
        "prints them) followed by a newline. Bytes that are not valid UTF-8 print as U+FFFD;\n"
        "special ids print as their spelling. DIR holds tiktoken.model and\n"
        "tokenizer_config.json (default: the bundled fixture model).\n",
    .rows = detokenize_rows, .n_rows = sizeof detokenize_rows / sizeof *detokenize_rows,
    .epilog = "Exit status 2 for an item that is not an id, 7 for an id outside the vocabulary\n"
              "(the message gives the id, the vocabulary size and, for --file, the line).\n",
    .max_positional = 2, .end_of_options = 1,
};

static bool is_tokenizer_dir(const char *path) {
    char p[PATH_MAX];
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    return stat(k3_path_join(p, sizeof p, path, "tiktoken.model"), &st) == 0;
}

/* ---- argument parsing ---------------------------------------------------------------- */

/* What is wrong with `rest` positionals after DIR, or NULL. */
static const char *arity_problem(bool has_file, int rest, bool with_options) {
    if (has_file) return rest ? (with_options ? "--file and TEXT both given"
                                              : "--file and IDS both given") : NULL;
    if (rest == 0) return with_options ? "missing TEXT (or --file PATH)"
                                       : "missing IDS (or --file PATH)";
    return rest > 1 ? "too many arguments, or DIR has no tiktoken.model" : NULL;
}

/* Parses [DIR] [options] ARG through the table of cmd (tokenize: --special and --file;
 * detokenize: --file). Returns 0, -1 after printing help, or K3_ERR_USAGE. */
static int parse_args(const k3_cli_command *cmd, int argc, char **argv, tok_args *a) {
    *a = (tok_args){0};
    k3_opts_parsed parsed;
    k3_opt_targets t = {.cmd = a};
    int rc = k3_opts_parse(cmd, argc, argv, &t, &parsed);
    if (rc) return rc;
    const char *const *pos = parsed.positional;
    int n_pos = parsed.n_positional, first = 0;
    if (n_pos > 0 && is_tokenizer_dir(pos[0])) a->dir = pos[first++];
    else if (n_pos > (a->file ? 0 : 1) && k3_model_name_split(pos[0], NULL, 0, NULL)) {
        char who[32]; /* a model's name, OWNER/NAME[@REV] */
        snprintf(who, sizeof who, "k3 %s", cmd->name);
        int rc2 = k3_model_arg(who, pos[first++], &a->dir);
        if (rc2) return rc2;
    }
    const char *problem = arity_problem(a->file != NULL, n_pos - first, cmd == &tokenize_cmd);
    if (problem) return k3_opts_usage_error(cmd, problem);
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
    k3_opts_error(cmd, err);
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
    int rc = parse_args(&tokenize_cmd, argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
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
    int rc = parse_args(&detokenize_cmd, argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
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
