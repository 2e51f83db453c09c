/* origin.c — local-server hygiene (issue 32, D20): which Host, Origin and Content-Type a
 * request may carry (srv.h). Without an API key (the default) any web page the user opens
 * could otherwise drive the server: a cross-site "simple" POST (text/plain, no preflight)
 * starts a generation, and a DNS-rebinding page (its own name resolving to 127.0.0.1) becomes
 * same-origin and reads replies. As llama.cpp, Ollama and Jupyter do, k3 answers only
 * requests addressed to it by a name it knows, from its own page or an allowed origin. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "srv.h"

/* 1 when the comma-separated list holds `item` (case-insensitive) or "*". */
static bool in_list(const char *list, const char *item, size_t n) {
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && *p == ' ') p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if ((len == 1 && *p == '*') || (len == n && !strncasecmp(p, item, n))) return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

bool k3_srv_host_allowed(const k3_server_opts *o, const char *host) {
    if (!host) return true; /* HTTP/1.0 without Host: no browser sends that */
    char name[256];
    size_t n;
    if (host[0] == '[') { /* [v6]:port */
        const char *end = strchr(host, ']');
        if (!end || (size_t)(end - host - 1) >= sizeof name) return false;
        n = (size_t)(end - host - 1);
        memcpy(name, host + 1, n);
        name[n] = 0;
        unsigned char a[16];
        if (inet_pton(AF_INET6, name, a) == 1) return true;
    } else {
        n = strcspn(host, ":");
        if (n >= sizeof name) return false;
        memcpy(name, host, n);
        name[n] = 0;
        unsigned char a[4];
        /* a literal address cannot be rebound: its page is that address's own */
        if (inet_pton(AF_INET, name, a) == 1) return true;
    }
    if (!strcasecmp(name, "localhost")) return true;
    if (o->host && !strcasecmp(name, o->host)) return true;
    return in_list(o->allow_host, name, n);
}

bool k3_srv_origin_allowed(const k3_server_opts *o, const char *origin, const char *host) {
    if (!origin) return true; /* not a browser, or a same-origin GET */
    if (host) { /* the page k3 serves itself (or through a TLS proxy that keeps Host) */
        size_t hn = strlen(host);
        for (int tls = 0; tls < 2; tls++) {
            const char *scheme = tls ? "https://" : "http://";
            size_t sn = strlen(scheme);
            if (!strncasecmp(origin, scheme, sn) && strlen(origin) == sn + hn &&
                !strcasecmp(origin + sn, host))
                return true;
        }
    }
    return in_list(o->allow_origin, origin, strlen(origin));
}

bool k3_srv_json_type(const char *content_type) {
    if (!content_type) return true; /* not a browser: its POSTs with a body always name one */
    size_t n = strcspn(content_type, "; \t");
    return n == 16 && !strncasecmp(content_type, "application/json", 16);
}
