/* ui.c — which embedded file of the chat page a URL names (ui.h). */
#include <string.h>

#include "ui.h"

static const char *type_of(const char *name) {
    const char *dot = strrchr(name, '.');
    if (dot && !strcmp(dot, ".html")) return "text/html; charset=utf-8";
    if (dot && !strcmp(dot, ".js")) return "text/javascript; charset=utf-8";
    if (dot && !strcmp(dot, ".css")) return "text/css; charset=utf-8";
    if (dot && !strcmp(dot, ".png")) return "image/png";
    return "application/octet-stream";
}

const k3_ui_file *k3_ui_find(const char *url, const char **content_type) {
    const char *name;
    if (!strcmp(url, "/") || !strcmp(url, "/ui") || !strcmp(url, "/ui/")) name = "index.html";
    else if (!strncmp(url, "/ui/", 4)) name = url + 4;
    else return NULL;
    for (const k3_ui_file *f = k3_ui_files; f->name; f++) {
        if (strcmp(f->name, name)) continue;
        if (content_type) *content_type = type_of(f->name);
        return f;
    }
    return NULL;
}
