/* ui.h — the chat page `k3 serve` serves at / and /ui (src/server/ui/: index.html, ui.js,
 * ui.css), embedded in the binary at build time by scripts/embed.sh so that it works offline
 * and needs no file next to the binary.
 *
 * Invariants: the page loads nothing from outside the server (no CDN, fonts or scripts);
 * model text is put in the page with textContent only, never parsed as HTML, and the page is
 * served with a Content-Security-Policy that forbids inline and foreign scripts as a second
 * line of defence. The page holds no secret, so it is served without the API key.
 */
#ifndef K3_SERVER_UI_H
#define K3_SERVER_UI_H

#include <stddef.h>

/* One embedded file; the generated table (build/ui_assets.c) ends with a {NULL} entry. */
typedef struct k3_ui_file {
    const char *name;            /* file name in src/server/ui/, e.g. "ui.js" */
    const unsigned char *data;   /* its bytes (not NUL-terminated) */
    size_t size;                 /* bytes */
} k3_ui_file;

extern const k3_ui_file k3_ui_files[];

/* The file served at URL path `url` ("/", "/ui", "/ui/" = index.html; "/ui/NAME" = NAME) and
 * its Content-Type, or NULL when the path is not the page's. */
const k3_ui_file *k3_ui_find(const char *url, const char **content_type);

#endif
