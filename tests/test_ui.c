/* The chat page embedded in the binary (src/server/ui.h): each URL names the right file, and
 * its bytes are those of src/server/ui/ as read from disk here (tests run from the repo root). */
#include "test.h"
#include "../src/server/ui.h"
#include "../src/util/fileio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_served(const char *url, const char *file, const char *type) {
    const char *ct = NULL;
    const k3_ui_file *f = k3_ui_find(url, &ct);
    CHECK(f != NULL, "%s: not found", url);
    CHECK(!strcmp(f->name, file), "%s: served %s, want %s", url, f->name, file);
    CHECK(ct && !strcmp(ct, type), "%s: type %s, want %s", url, ct ? ct : "(none)", type);
    char path[256];
    snprintf(path, sizeof path, "src/server/ui/%s", file);
    char *want = NULL;
    size_t n = 0;
    k3_err err = {0};
    CHECK(k3_read_file(path, 1u << 24, &want, &n, &err) == K3_OK, "%s", err.msg);
    int same = f->size == n && !memcmp(f->data, want, n);
    free(want);
    CHECK(same, "%s: %zu embedded bytes differ from %s (%zu bytes)", url, f->size, path, n);
}

static void test_page_files(void) {
    static const char *const index_urls[] = {"/", "/ui", "/ui/", "/ui/index.html"};
    for (size_t i = 0; i < sizeof index_urls / sizeof *index_urls; i++) {
        check_served(index_urls[i], "index.html", "text/html; charset=utf-8");
        if (k3_test_stopped()) return;
    }
    check_served("/ui/ui.js", "ui.js", "text/javascript; charset=utf-8");
    if (k3_test_stopped()) return;
    check_served("/ui/ui.css", "ui.css", "text/css; charset=utf-8");
}

static void test_other_paths_are_not_the_page(void) {
    static const char *const urls[] = {"", "/v1/", "/health", "/uix", "/ui/missing.js",
                                       "/ui/ui.js/", "/ui//ui.js", "/ui/../health", "/UI"};
    for (size_t i = 0; i < sizeof urls / sizeof *urls; i++)
        CHECK(k3_ui_find(urls[i], NULL) == NULL, "'%s' should not be a page file", urls[i]);
}

const k3_test k3_suite_ui[] = {{"page_files", test_page_files},
                               {"other_paths_are_not_the_page", test_other_paths_are_not_the_page},
                               {0}};
