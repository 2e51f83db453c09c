/* cmd_render.c — `k3 render`: the exact prompt an OpenAI chat-completions request body
 * renders to in the K3 chat format (src/chat/render.h), as text, token ids or segments. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../chat/render.h"
#include "../server/server.h"
#include "../util/fileio.h"
#include "cli.h"
#include "opts.h"

typedef struct render_args {
    const char *request;
    bool ids, segments;
} render_args;

#define RENDER(f) K3_OPT_CMD(render_args, f), .field = #f
static const k3_opt render_rows[] = {
    {.flag = "--request", RENDER(request), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY,
     .meta = "FILE", .help = "the request body (- reads stdin)"},
    {.flag = "--ids", RENDER(ids), .type = K3_OPT_SWITCH, .value = 1,
     .help = "print the token ids instead (one line, comma-separated): each segment\n"
             "encoded on its own, structure as special ids, all content as plain text"},
    {.flag = "--segments", RENDER(segments), .type = K3_OPT_SWITCH, .value = 1,
     .help = "print the segments as JSON [[text, allow_special], ...]"},
};

static const k3_cli_command render_cmd = {
    .name = "render",
    .usage =
        "usage: k3 render [DIR] --request FILE [--ids | --segments]\n"
        "\n"
        "Prints the prompt that the OpenAI chat-completions request body in FILE (JSON; - reads\n"
        "stdin) renders to in the K3 chat format, exactly as the model sees it: the text, with\n"
        "no newline added. Fields: messages, tools, tool_choice (auto, required, none),\n"
        "response_format, reasoning_effort (low, high, max, none), and the k3 extensions\n"
        "\"thinking\": false and \"add_generation_prompt\": false. Other fields (model,\n"
        "temperature, ...) are ignored here.\n"
        "DIR holds tiktoken.model and tokenizer_config.json (default: the bundled fixture\n"
        "model); it is read only for --ids.\n",
    .rows = render_rows, .n_rows = sizeof render_rows / sizeof *render_rows,
    .max_positional = 1,
};

/* Reads a whole file, or stdin for "-". */
static int read_request(const char *path, char **buf, size_t *len, k3_err *err) {
    if (strcmp(path, "-")) return k3_read_file(path, (size_t)256 << 20, buf, len, err);
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        n += fread(p + n, 1, cap - n - 1, stdin);
        if (n < cap - 1) break;
        char *q = realloc(p, cap *= 2);
        if (!q) free(p);
        p = q;
    }
    if (!p) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (ferror(stdin)) {
        free(p);
        return k3_fail(err, K3_ERR_IO, "stdin: read failed: %s", strerror(errno));
    }
    p[n] = 0;
    *buf = p;
    *len = n;
    return K3_OK;
}

static int print_ids(const char *dir, const k3_segments *segs, k3_err *err) {
    k3_tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = k3_tokenizer_load(dir, &t, err);
    if (!rc) rc = k3_segments_encode(t, segs, &ids, &n, err);
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    if (!rc) printf("\n");
    free(ids);
    k3_tokenizer_free(t);
    return rc;
}

static int print_segments(const k3_segments *segs, k3_err *err) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < segs->n; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(arr, pair);
        cJSON_AddItemToArray(pair, cJSON_CreateString(segs->v[i].text));
        cJSON_AddItemToArray(pair, cJSON_CreateBool(segs->v[i].allow_special));
    }
    char *s = arr ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    if (!s) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    printf("%s\n", s);
    free(s);
    return K3_OK;
}

int k3_cmd_render(int argc, char **argv) {
    render_args a = {0};
    k3_opts_parsed parsed;
    k3_opt_targets t = {.cmd = &a};
    int prc = k3_opts_parse(&render_cmd, argc, argv, &t, &parsed);
    if (prc) return prc < 0 ? 0 : prc;
    if (!a.request || (a.ids && a.segments))
        return k3_opts_usage_error(&render_cmd, "give --request FILE, and at most one of --ids "
                                   "and --segments");
    const char *dir = parsed.n_positional ? parsed.positional[0] : NULL, *request = a.request;
    bool ids = a.ids, segments = a.segments;
    k3_err err = {0};
    k3_segments segs = {0};
    char *body = NULL;
    size_t len = 0;
    int rc = read_request(request, &body, &len, &err);
    char where[160];
    if (!rc && k3_server_body_has_nul(body, len, where, sizeof where))
        rc = k3_fail(&err, K3_ERR_INPUT, "%s: '%s' contains a NUL character (\\u0000), which "
                     "k3 cannot pass to the model (k3 serve refuses it too): remove it", request,
                     where[0] ? where : "a string of the request");
    if (!rc && (rc = k3_chat_render_json(body, len, &segs, &err)))
        k3_err_prefix(&err, "%s", request);
    if (!rc && ids) {
        if (!(rc = k3_model_arg("k3 render", dir, &dir))) rc = print_ids(dir, &segs, &err);
        else err.msg[0] = 0; /* reported */
    } else if (!rc && segments) {
        rc = print_segments(&segs, &err);
    } else if (!rc) {
        size_t n;
        char *text = k3_segments_text(&segs, &n);
        if (!text) rc = k3_fail(&err, K3_ERR_GENERIC, "out of memory");
        else fwrite(text, 1, n, stdout);
        free(text);
    }
    if (rc && err.msg[0]) {
        fflush(stdout);
        k3_opts_error("render", &err);
    }
    free(body);
    k3_segments_free(&segs);
    return rc;
}
