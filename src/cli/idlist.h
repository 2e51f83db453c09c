/* idlist.h — the token-id lists the CLI reads (k3 run --prompt-ids, k3 quality --ids,
 * k3 detokenize IDS or --file): one parser, so all accept the same text and fail with the
 * same messages.
 *
 * Syntax: decimal ids separated by one comma and/or whitespace (spaces, tabs, newlines), so
 * `k3 tokenize` output and files of one id per line both read back; no empty item (",,", a
 * leading or trailing comma). Only whitespace, or nothing, is the empty list. A file may start
 * with a UTF-8 byte order mark (skipped); a NUL byte anywhere is refused (not a text file). */
#ifndef K3_CLI_IDLIST_H
#define K3_CLI_IDLIST_H

#include <stddef.h>
#include <stdint.h>

#include "../util/err.h"

/* Parses text[0, len) into a malloc'd array *ids of *n ids (NULL and 0 for an empty list).
 * src names the text in messages: a flag or argument (the text is quoted, shortened when
 * long) or, with is_file, a path (then "path:line"). Every id must be < vocab.
 * Errors: K3_ERR_USAGE (an item that is not a non-negative decimal integer, an empty item,
 * a NUL byte),
 * K3_ERR_INPUT (an id >= vocab: the message gives the id and the vocabulary size),
 * K3_ERR_GENERIC (out of memory). */
int k3_cli_parse_ids(const char *text, size_t len, const char *src, int is_file, int vocab,
                     int32_t **ids, size_t *n, k3_err *err);

#endif
