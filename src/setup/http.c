/* http.c — the range-fetch client (setup.h part 1): libcurl multi interface, a pool of
 * easy handles whose connections the multi handle keeps alive, strict response checks,
 * retries with exponential backoff, and a redirect policy of our own (libcurl's automatic
 * following is off so that every hop is checked and the token never leaves the endpoint). */
#include "setup.h"
#include "../util/clock.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define MAX_HOPS 10
#define MAX_BACKOFF_S 30.0
#define MAX_REDIRECTS_CACHED 512

typedef struct redirect {
    char *from, *to;
} redirect;

struct k3_http {
    k3_http_opts o;
    char *endpoint, *token;
    char ep_scheme[16], ep_host[256];
    long ep_port;
    char *auth_line;
    CURLM *multi;
    CURL **idle;              /* pooled easy handles not in use */
    int n_idle;               /* at most `connections` handles exist */
    redirect *redir;
    int n_redir;
    pthread_mutex_t mu;
    uint64_t n_requests, n_bytes;
};

enum xfer_state { X_NEW, X_WAIT, X_RUN, X_DONE };

/* One request's transfer state across attempts and redirect hops. */
typedef struct xfer {
    k3_http *h;
    k3_http_req *r;
    enum xfer_state state;
    CURL *easy;
    struct curl_slist *hdrs;
    char *url;                /* current target: r->url, a cached redirect target, or a hop */
    bool via_cache, refreshed;
    int hops;
    double not_before;
    uint64_t start;           /* absolute offset this attempt asks from */
    double t_start;           /* monotonic seconds the attempt began (its deadline) */
    size_t cap;               /* whole-file body capacity */
    /* the current response */
    long status;
    bool have_cr, have_cl, checked, discard;
    uint64_t cr_a, cr_b, cr_total, cl;
    /* why the current attempt failed ("" = it did not) */
    char fail[320];
    bool fail_retry;
    int fail_code;
    char errbuf[CURL_ERROR_SIZE];
} xfer;

/* ---- URLs ----------------------------------------------------------------------------- */

char *k3_hub_url(char *buf, size_t cap, const char *endpoint, const char *repo,
                 const char *revision, const char *file) {
    size_t n = strlen(endpoint);
    while (n > 0 && endpoint[n - 1] == '/') n--;
    if (snprintf(buf, cap, "%.*s/%s/resolve/%s/%s", (int)n, endpoint, repo, revision, file) >=
        (int)cap)
        buf[0] = 0;
    return buf;
}

char *k3_url_for_humans(char *buf, size_t cap, const char *url) {
    const char *scheme_end = strstr(url, "://");
    const char *at = scheme_end ? strchr(scheme_end + 3, '@') : NULL;
    const char *slash = scheme_end ? strchr(scheme_end + 3, '/') : NULL;
    if (at && (!slash || at < slash))
        snprintf(buf, cap, "%.*s%s", (int)(scheme_end + 3 - url), url, at + 1);
    else
        snprintf(buf, cap, "%s", url);
    return buf;
}

/* Scheme, host and effective port of url. Returns 0 on success. */
static int url_origin(const char *url, char *scheme, size_t scap, char *host, size_t hcap,
                      long *port) {
    CURLU *u = curl_url();
    char *s = NULL, *ho = NULL, *po = NULL;
    int rc = -1;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &s, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &ho, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &po, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        snprintf(scheme, scap, "%s", s);
        snprintf(host, hcap, "%s", ho);
        *port = strtol(po, NULL, 10);
        rc = 0;
    }
    curl_free(s);
    curl_free(ho);
    curl_free(po);
    curl_url_cleanup(u);
    return rc;
}

static bool same_origin_as_endpoint(const k3_http *h, const char *url) {
    char scheme[16], host[256];
    long port;
    return url_origin(url, scheme, sizeof scheme, host, sizeof host, &port) == 0 &&
           !strcasecmp(scheme, h->ep_scheme) && !strcasecmp(host, h->ep_host) &&
           port == h->ep_port;
}

/* The redirect policy: to https anywhere, or to the endpoint's own host and port. */
static bool redirect_allowed(const k3_http *h, const char *url) {
    char scheme[16], host[256];
    long port;
    if (url_origin(url, scheme, sizeof scheme, host, sizeof host, &port)) return false;
    if (!strcasecmp(scheme, "https")) return true;
    return !strcasecmp(scheme, "http") && !strcasecmp(host, h->ep_host) && port == h->ep_port;
}

/* ---- client ---------------------------------------------------------------------------- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

int k3_http_new(const k3_http_opts *o, k3_http **out, k3_err *err) {
    pthread_once(&curl_once, curl_init_once);
    k3_http *h = calloc(1, sizeof *h);
    if (!h) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    h->o = *o;
    if (h->o.connections <= 0) h->o.connections = 4;
    if (h->o.retries == 0) h->o.retries = 5;
    if (h->o.retries < 0) h->o.retries = 0;
    if (h->o.backoff_s <= 0) h->o.backoff_s = 0.5;
    if (h->o.timeout_s <= 0) h->o.timeout_s = 30;
    pthread_mutex_init(&h->mu, NULL);
    h->endpoint = strdup(o->endpoint ? o->endpoint : K3_HF_ENDPOINT);
    h->multi = curl_multi_init();
    h->idle = calloc((size_t)h->o.connections, sizeof *h->idle);
    if (!h->endpoint || !h->multi || !h->idle) {
        k3_http_free(h);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    char shown[512];
    if (url_origin(h->endpoint, h->ep_scheme, sizeof h->ep_scheme, h->ep_host, sizeof h->ep_host,
                   &h->ep_port) ||
        (strcasecmp(h->ep_scheme, "http") && strcasecmp(h->ep_scheme, "https"))) {
        k3_url_for_humans(shown, sizeof shown, h->endpoint);
        k3_http_free(h);
        return k3_fail(err, K3_ERR_USAGE, "endpoint '%s' is not an http:// or https:// URL",
                       shown);
    }
    if (o->token && o->token[0]) {
        size_t n = strlen(o->token) + 32;
        if (!(h->auth_line = malloc(n))) {
            k3_http_free(h);
            return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        }
        snprintf(h->auth_line, n, "Authorization: Bearer %s", o->token);
    }
    curl_multi_setopt(h->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)h->o.connections);
    curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS, (long)h->o.connections * 2);
    *out = h;
    return K3_OK;
}

void k3_http_free(k3_http *h) {
    if (!h) return;
    for (int i = 0; i < h->n_idle; i++) curl_easy_cleanup(h->idle[i]);
    if (h->multi) curl_multi_cleanup(h->multi);
    for (int i = 0; i < h->n_redir; i++) {
        free(h->redir[i].from);
        free(h->redir[i].to);
    }
    free(h->redir);
    free(h->idle);
    free(h->endpoint);
    if (h->auth_line) {
        memset(h->auth_line, 0, strlen(h->auth_line)); /* the token should not linger */
        free(h->auth_line);
    }
    pthread_mutex_destroy(&h->mu);
    free(h);
}

void k3_http_stats(const k3_http *h, uint64_t *requests, uint64_t *bytes) {
    if (requests) *requests = __atomic_load_n(&h->n_requests, __ATOMIC_RELAXED);
    if (bytes) *bytes = __atomic_load_n(&h->n_bytes, __ATOMIC_RELAXED);
}

static const char *redirect_lookup(const k3_http *h, const char *from) {
    for (int i = 0; i < h->n_redir; i++)
        if (!strcmp(h->redir[i].from, from)) return h->redir[i].to;
    return NULL;
}

static void redirect_forget(k3_http *h, const char *from) {
    for (int i = 0; i < h->n_redir; i++)
        if (!strcmp(h->redir[i].from, from)) {
            free(h->redir[i].from);
            free(h->redir[i].to);
            h->redir[i] = h->redir[--h->n_redir];
            return;
        }
}

/* Remembers that `from` ends at `to`, so the next request for it costs one round trip. */
static void redirect_remember(k3_http *h, const char *from, const char *to) {
    redirect_forget(h, from);
    if (h->n_redir == MAX_REDIRECTS_CACHED) redirect_forget(h, h->redir[0].from);
    if (h->n_redir % 64 == 0) {
        redirect *nr = realloc(h->redir, (size_t)(h->n_redir + 64) * sizeof *nr);
        if (!nr) return; /* only an optimisation */
        h->redir = nr;
    }
    char *f = strdup(from), *t = strdup(to);
    if (!f || !t) {
        free(f);
        free(t);
        return;
    }
    h->redir[h->n_redir++] = (redirect){f, t};
}

/* ---- response checks ----------------------------------------------------------------- */

static void set_fail(xfer *x, bool retry, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_fail(xfer *x, bool retry, int code, const char *fmt, ...) {
    if (x->fail[0]) return; /* the first reason is the real one */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->fail, sizeof x->fail, fmt, ap);
    va_end(ap);
    x->fail_retry = retry;
    x->fail_code = code;
}

static bool is_hex64(const char *s, size_t n) {
    if (n != 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') ||
              (s[i] >= 'A' && s[i] <= 'F')))
            return false;
    return true;
}

/* An ETag value (W/"..." or "...") that is a sha256, into r->sha256 (lowercase). */
static void take_sha256(k3_http_req *r, const char *v, size_t n, bool authoritative) {
    if (r->sha256[0] && !authoritative) return;
    if (n >= 2 && v[0] == 'W' && v[1] == '/') v += 2, n -= 2;
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') v++, n -= 2;
    if (!is_hex64(v, n)) return;
    for (size_t i = 0; i < 64; i++) r->sha256[i] = (char)(v[i] | 0x20);
    r->sha256[64] = 0;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *ud) {
    xfer *x = ud;
    size_t n = sz * nm, len = n;
    while (len > 0 && (p[len - 1] == '\r' || p[len - 1] == '\n')) len--;
    char line[1024];
    if (len >= sizeof line) return n; /* no header we read is that long */
    memcpy(line, p, len);
    line[len] = 0;
    if (!strncmp(line, "HTTP/", 5)) { /* a new response (each redirect hop has one) */
        const char *sp = strchr(line, ' ');
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->have_cr = x->have_cl = x->checked = x->discard = false;
        return n;
    }
    char *colon = strchr(line, ':');
    if (!colon) return n;
    *colon = 0;
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    size_t vn = strlen(v);
    while (vn > 0 && (v[vn - 1] == ' ' || v[vn - 1] == '\t')) v[--vn] = 0;
    unsigned long long a, b, t;
    if (!strcasecmp(line, "content-range")) {
        /* An unparsable value counts as present and matching no range, so it is refused. */
        x->have_cr = true;
        x->cr_a = x->cr_b = x->cr_total = 0;
        if (sscanf(v, "bytes %llu-%llu/%llu", &a, &b, &t) == 3)
            x->cr_a = a, x->cr_b = b, x->cr_total = t;
    } else if (!strcasecmp(line, "content-length")) {
        char *end;
        errno = 0;
        x->cl = strtoull(v, &end, 10);
        x->have_cl = !errno && end != v;
    } else if (!strcasecmp(line, "x-linked-etag")) {
        take_sha256(x->r, v, vn, true);
    } else if (!strcasecmp(line, "etag")) {
        take_sha256(x->r, v, vn, false);
    } else if (!strcasecmp(line, "x-repo-commit") && vn == 40 && strspn(v, "0123456789abcdef") == 40) {
        memcpy(x->r->repo_commit, v, 41);
    }
    return n;
}

/* Checks the status line and headers of a 200/206 response before any body byte is kept.
 * Returns false when the response must be thrown away (x->fail says why). */
static bool check_response(xfer *x) {
    if (x->checked) return !x->fail[0];
    x->checked = true;
    k3_http_req *r = x->r;
    long st = x->status;
    if (st != 200 && st != 206) { /* redirects and errors: handled when the transfer ends */
        x->discard = true;
        return true;
    }
    if (r->nbytes) {
        uint64_t want_b = r->offset + r->nbytes - 1;
        if (st != 206)
            set_fail(x, true, K3_ERR_NETWORK, "HTTP %ld to a range request (want 206: does the "
                     "server support ranges?)", st);
        else if (!x->have_cr)
            set_fail(x, true, K3_ERR_NETWORK, "HTTP 206 without a Content-Range header");
        else if (x->cr_a != x->start || x->cr_b != want_b || x->cr_total <= want_b)
            set_fail(x, true, K3_ERR_NETWORK, "wrong Content-Range: got bytes %llu-%llu/%llu, "
                     "asked for bytes %llu-%llu", (unsigned long long)x->cr_a,
                     (unsigned long long)x->cr_b, (unsigned long long)x->cr_total,
                     (unsigned long long)x->start, (unsigned long long)want_b);
        else if (x->have_cl && x->cl != want_b - x->start + 1)
            set_fail(x, true, K3_ERR_NETWORK, "Content-Length %llu does not match the range "
                     "bytes %llu-%llu", (unsigned long long)x->cl, (unsigned long long)x->start,
                     (unsigned long long)want_b);
        else if (r->expect_total && x->cr_total != r->expect_total)
            set_fail(x, false, K3_ERR_NETWORK, "the file is now %llu bytes, the install expects "
                     "%llu: the repository changed upstream (pin --revision)",
                     (unsigned long long)x->cr_total, (unsigned long long)r->expect_total);
        else
            r->total_bytes = x->cr_total;
    } else {
        if (st != 200)
            set_fail(x, true, K3_ERR_NETWORK, "HTTP %ld to a whole-file request (want 200)", st);
        else if (x->have_cl && r->max_bytes && x->cl > r->max_bytes)
            set_fail(x, false, K3_ERR_NETWORK, "the file has %llu bytes, more than the %llu "
                     "expected for it", (unsigned long long)x->cl,
                     (unsigned long long)r->max_bytes);
        else if (x->have_cl && r->expect_total && x->cl != r->expect_total)
            set_fail(x, false, K3_ERR_NETWORK, "the file is now %llu bytes, the install expects "
                     "%llu: the repository changed upstream", (unsigned long long)x->cl,
                     (unsigned long long)r->expect_total);
        else if (x->have_cl)
            r->total_bytes = x->cl;
    }
    return !x->fail[0];
}

static int pwrite_all(int fd, const char *p, size_t n, uint64_t off) {
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        p += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

static size_t on_body(char *p, size_t sz, size_t nm, void *ud) {
    xfer *x = ud;
    k3_http_req *r = x->r;
    size_t n = sz * nm;
    if (!check_response(x)) return 0; /* aborts the transfer: nothing of it is kept */
    if (x->discard) return n;
    if (r->nbytes) {
        if (r->done + n > r->nbytes) {
            set_fail(x, true, K3_ERR_NETWORK, "the server sent more bytes than the range");
            return 0;
        }
        if (r->dst) {
            memcpy((char *)r->dst + r->done, p, n);
        } else {
            int e = pwrite_all(r->fd, p, n, r->file_offset + r->done);
            if (e) {
                set_fail(x, false, K3_ERR_IO, "cannot write the body to disk: %s", strerror(e));
                return 0;
            }
        }
    } else {
        if (r->max_bytes && r->done + n > r->max_bytes) {
            set_fail(x, false, K3_ERR_NETWORK, "the body is larger than the %llu bytes "
                     "expected", (unsigned long long)r->max_bytes);
            return 0;
        }
        if (r->done + n + 1 > x->cap) {
            size_t nc = x->cap ? x->cap : 65536;
            while (nc < r->done + n + 1) nc *= 2;
            char *nb = realloc(r->body, nc);
            if (!nb) {
                set_fail(x, false, K3_ERR_GENERIC, "out of memory");
                return 0;
            }
            r->body = nb, x->cap = nc;
        }
        memcpy(r->body + r->done, p, n);
        r->body[r->done + n] = 0;
    }
    r->done += n;
    __atomic_add_fetch(&x->h->n_bytes, n, __ATOMIC_RELAXED);
    if (x->h->o.on_bytes) x->h->o.on_bytes(x->h->o.user, n);
    return n;
}

/* An attempt's deadline (issue 32): --timeout plus its bytes at K3_SETUP_MIN_RATE, so that a
 * server dripping a few bytes a second (which never trips the no-byte timeout) is retried.
 * Its bytes: the range asked for, else (a whole file) the length once the answer's headers
 * give it, else none yet. */
static bool past_deadline(xfer *x, curl_off_t dltotal) {
    const k3_http_req *r = x->r;
    double bytes = r->nbytes ? (double)(r->nbytes - r->done) : dltotal > 0 ? (double)dltotal : 0;
    double limit = x->h->o.timeout_s + bytes / K3_SETUP_MIN_RATE;
    if (k3_now_s() - x->t_start <= limit) return false;
    set_fail(x, true, K3_ERR_NETWORK, "no complete answer within %.0f s (the deadline for %.0f "
             "bytes: --timeout plus %d KiB/s)", limit, bytes, K3_SETUP_MIN_RATE / 1024);
    return true;
}

static int on_xferinfo(void *ud, curl_off_t dltotal, curl_off_t b, curl_off_t c, curl_off_t d) {
    (void)b, (void)c, (void)d;
    xfer *x = ud;
    if (x->h->o.interrupt && *x->h->o.interrupt) return 1;
    return past_deadline(x, dltotal) ? 1 : 0;
}

/* ---- one attempt ---------------------------------------------------------------------- */

static void release_easy(k3_http *h, xfer *x) {
    if (!x->easy) return;
    curl_multi_remove_handle(h->multi, x->easy);
    h->idle[h->n_idle++] = x->easy; /* keeps its connection in the multi's cache */
    x->easy = NULL;
    curl_slist_free_all(x->hdrs);
    x->hdrs = NULL;
}

static int start_attempt(k3_http *h, xfer *x, k3_err *err) {
    k3_http_req *r = x->r;
    CURL *e = h->n_idle ? h->idle[--h->n_idle] : curl_easy_init();
    if (!e) return k3_fail(err, K3_ERR_GENERIC, "out of memory (curl handle)");
    x->easy = e;
    x->start = r->offset + r->done;
    x->t_start = k3_now_s();
    x->status = 0;
    x->have_cr = x->have_cl = x->checked = x->discard = false;
    x->fail[0] = x->errbuf[0] = 0;
    char range[64];
    if (r->nbytes)
        snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)x->start,
                 (unsigned long long)(r->offset + r->nbytes - 1));
    x->hdrs = curl_slist_append(NULL, "Accept-Encoding: identity");
    if (h->auth_line && same_origin_as_endpoint(h, x->url))
        x->hdrs = curl_slist_append(x->hdrs, h->auth_line);
    curl_easy_setopt(e, CURLOPT_URL, x->url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(e, CURLOPT_RANGE, r->nbytes ? range : NULL);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "k3-setup/1");
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_xferinfo);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(h->o.timeout_s * 1000));
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)(h->o.timeout_s < 1 ? 1 : h->o.timeout_s));
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    if (curl_multi_add_handle(h->multi, e) != CURLM_OK) {
        release_easy(h, x);
        return k3_fail(err, K3_ERR_GENERIC, "curl_multi_add_handle failed");
    }
    __atomic_add_fetch(&h->n_requests, 1, __ATOMIC_RELAXED);
    x->state = X_RUN;
    return K3_OK;
}

static bool curl_code_retryable(CURLcode c) {
    switch (c) {
    case CURLE_COULDNT_CONNECT: case CURLE_COULDNT_RESOLVE_HOST: case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR: case CURLE_SEND_ERROR: case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING: case CURLE_SSL_CONNECT_ERROR: case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM: case CURLE_WEIRD_SERVER_REPLY: case CURLE_READ_ERROR:
        return true;
    default:
        return false;
    }
}

enum outcome { O_OK, O_RETRY, O_RESTART, O_FATAL };

/* Judges a finished attempt. O_RESTART re-issues at once (redirect hop, stale cached
 * redirect); O_RETRY waits for the backoff; O_FATAL leaves x->fail describing it. */
static enum outcome judge(k3_http *h, xfer *x, CURLcode cc) {
    k3_http_req *r = x->r;
    if (h->o.interrupt && *h->o.interrupt) {
        set_fail(x, false, K3_ERR_INTERRUPTED, "interrupted");
        return O_FATAL;
    }
    if (!x->fail[0] && cc == CURLE_OK && (x->status == 200 || x->status == 206))
        check_response(x); /* an empty body never reached on_body */
    if (x->fail[0]) return x->fail_retry ? O_RETRY : O_FATAL;
    if (cc != CURLE_OK) {
        set_fail(x, curl_code_retryable(cc), K3_ERR_NETWORK, "%s",
                 x->errbuf[0] ? x->errbuf : curl_easy_strerror(cc));
        return x->fail_retry ? O_RETRY : O_FATAL;
    }
    long st = x->status;
    if (st >= 300 && st < 400 && st != 304) {
        char *loc = NULL;
        curl_easy_getinfo(x->easy, CURLINFO_REDIRECT_URL, &loc);
        char shown[512];
        if (!loc) {
            set_fail(x, true, K3_ERR_NETWORK, "HTTP %ld redirect without a Location", st);
            return O_RETRY;
        }
        if (!redirect_allowed(h, loc)) {
            set_fail(x, false, K3_ERR_NETWORK, "refused a redirect to %s: only https: or the "
                     "endpoint's own host are followed",
                     k3_url_for_humans(shown, sizeof shown, loc));
            return O_FATAL;
        }
        if (++x->hops > MAX_HOPS) {
            set_fail(x, false, K3_ERR_NETWORK, "more than %d redirects", MAX_HOPS);
            return O_FATAL;
        }
        char *nu = strdup(loc);
        if (!nu) {
            set_fail(x, false, K3_ERR_GENERIC, "out of memory");
            return O_FATAL;
        }
        free(x->url);
        x->url = nu;
        redirect_remember(h, r->url, nu);
        return O_RESTART;
    }
    if (st == 200 || st == 206) {
        if (r->nbytes && r->done != r->nbytes) {
            set_fail(x, true, K3_ERR_NETWORK, "truncated body: %llu of %llu bytes",
                     (unsigned long long)r->done, (unsigned long long)r->nbytes);
            return O_RETRY;
        }
        if (!r->nbytes && x->have_cl && r->done != x->cl) {
            set_fail(x, true, K3_ERR_NETWORK, "truncated body: %llu of %llu bytes",
                     (unsigned long long)r->done, (unsigned long long)x->cl);
            return O_RETRY;
        }
        r->status = (int)st;
        if (!r->nbytes) r->total_bytes = r->done;
        return O_OK;
    }
    if (x->via_cache && !x->refreshed && (st == 401 || st == 403 || st == 404 || st == 410)) {
        redirect_forget(h, r->url); /* a signed CDN URL expired: ask the endpoint again */
        x->refreshed = true;
        return O_RESTART;
    }
    r->status = (int)st;
    if (st == 404 && r->not_found_ok) return O_OK;
    set_fail(x, st >= 500 || st == 408 || st == 429, K3_ERR_NETWORK, "HTTP %ld%s", st,
             st == 401 || st == 403 ? " (set HF_TOKEN if the repository is gated)"
             : st == 404 ? " (not found: check --repo, --revision and the file name)" : "");
    return x->fail_retry ? O_RETRY : O_FATAL;
}

/* Sets x->url for a fresh attempt chain: the cached redirect target if there is one. */
static int aim(k3_http *h, xfer *x, k3_err *err) {
    const char *cached = x->refreshed ? NULL : redirect_lookup(h, x->r->url);
    free(x->url);
    x->url = strdup(cached ? cached : x->r->url);
    x->via_cache = cached != NULL;
    x->hops = 0;
    if (!x->url) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    return K3_OK;
}

static int fail_for_good(xfer *x, k3_err *err) {
    char shown[1024];
    k3_url_for_humans(shown, sizeof shown, x->r->url);
    const char *what = x->r->what ? x->r->what : "download";
    if (x->fail_code == K3_ERR_INTERRUPTED)
        return k3_fail(err, K3_ERR_INTERRUPTED, "interrupted (run the same command again to "
                       "resume)");
    if (x->r->nbytes)
        return k3_fail(err, x->fail_code, "%s: bytes %llu-%llu of %s: %s%s%d attempt%s)", what,
                       (unsigned long long)x->r->offset,
                       (unsigned long long)(x->r->offset + x->r->nbytes - 1), shown, x->fail,
                       x->fail_retry ? " (gave up after " : " (", x->r->attempts,
                       x->r->attempts == 1 ? "" : "s");
    return k3_fail(err, x->fail_code, "%s: %s: %s%s%d attempt%s)", what, shown, x->fail,
                   x->fail_retry ? " (gave up after " : " (", x->r->attempts,
                   x->r->attempts == 1 ? "" : "s");
}

/* One line on h->o.log (if set) before a retry waits: what, the attempt to come of the most
 * allowed, the wait and why. On a terminal it clears the progress bar's line first; the bar
 * redraws below it. */
static void log_retry(const k3_http *h, const xfer *x, double wait_s) {
    if (!h->o.log) return;
    char shown[1024];
    k3_url_for_humans(shown, sizeof shown, x->r->url);
    int tty = isatty(fileno(h->o.log));
    fprintf(h->o.log, "%sk3 setup: retrying %s%s%s in %.1f s (attempt %d of %d): %s%s\n",
            tty ? "\r" : "", x->r->what ? x->r->what : "", x->r->what ? " of " : "", shown,
            wait_s, x->r->attempts + 1, h->o.retries + 1, x->fail, tty ? "\033[K" : "");
    fflush(h->o.log);
}

/* ---- the batch loop ------------------------------------------------------------------- */

static void stop_all(k3_http *h, xfer *xs, int n) {
    for (int i = 0; i < n; i++) release_easy(h, &xs[i]);
}

static int run_batch(k3_http *h, xfer *xs, int n,
                     int (*on_done)(void *, k3_http_req *, k3_err *), void *user, k3_err *err) {
    int next_new = 0, running = 0, finished = 0, waiting = 0;
    while (finished < n) {
        if (h->o.interrupt && *h->o.interrupt)
            return k3_fail(err, K3_ERR_INTERRUPTED, "interrupted (run the same command again "
                           "to resume)");
        double now = k3_now_s(), wake = now + 0.1;
        /* retries first (they are older), then new requests in the caller's order */
        for (int i = 0; waiting && i < next_new && running < h->o.connections; i++) {
            xfer *x = &xs[i];
            if (x->state != X_WAIT) continue;
            if (x->not_before > now) {
                if (x->not_before < wake) wake = x->not_before;
                continue;
            }
            waiting--;
            int rc = aim(h, x, err);
            if (!rc) rc = start_attempt(h, x, err);
            if (rc) return rc;
            x->r->attempts++;
            running++;
        }
        while (next_new < n && running < h->o.connections) {
            xfer *x = &xs[next_new++];
            int rc = aim(h, x, err);
            if (!rc) rc = start_attempt(h, x, err);
            if (rc) return rc;
            x->r->attempts++;
            running++;
        }
        int still;
        curl_multi_perform(h->multi, &still);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(h->multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            xfer *x = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            enum outcome oc = judge(h, x, m->data.result);
            release_easy(h, x);
            running--;
            if (oc == O_RESTART) { /* a redirect hop, or back to r->url after a stale one */
                int rc = x->refreshed && x->via_cache ? aim(h, x, err) : K3_OK;
                if (!rc) rc = start_attempt(h, x, err);
                if (rc) return rc;
                running++;
            } else if (oc == O_RETRY && x->r->attempts <= h->o.retries) {
                double d = h->o.backoff_s;
                for (int k = 1; k < x->r->attempts && d < MAX_BACKOFF_S; k++) d *= 2;
                if (d > MAX_BACKOFF_S) d = MAX_BACKOFF_S;
                x->not_before = k3_now_s() + d;
                log_retry(h, x, d);
                if (!x->r->nbytes) x->r->done = 0; /* whole files restart from zero */
                x->state = X_WAIT;
                waiting++;
            } else if (oc == O_RETRY || oc == O_FATAL) {
                return fail_for_good(x, err);
            } else {
                x->state = X_DONE;
                finished++;
                if (on_done) {
                    int rc = on_done(user, x->r, err);
                    if (rc) return rc;
                }
            }
        }
        if (finished < n && running > 0) {
            double t = wake - k3_now_s();
            int ms = t <= 0 ? 0 : t > 0.1 ? 100 : (int)(t * 1000) + 1;
            curl_multi_poll(h->multi, NULL, 0, ms, NULL);
        } else if (finished < n && waiting) {
            double t = wake - k3_now_s();
            if (t > 0) usleep((useconds_t)(t > 0.1 ? 100000 : t * 1e6));
        }
    }
    return K3_OK;
}

int k3_http_fetch(k3_http *h, k3_http_req *reqs, int n,
                  int (*on_done)(void *user, k3_http_req *r, k3_err *err), void *user,
                  k3_err *err) {
    if (n <= 0) return K3_OK;
    xfer *xs = calloc((size_t)n, sizeof *xs);
    if (!xs) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int i = 0; i < n; i++) {
        xs[i].h = h;
        xs[i].r = &reqs[i];
        reqs[i].done = 0;
        reqs[i].attempts = 0;
        reqs[i].status = 0;
        reqs[i].sha256[0] = 0;
        reqs[i].repo_commit[0] = 0;
        reqs[i].body = NULL;
    }
    pthread_mutex_lock(&h->mu);
    int rc = run_batch(h, xs, n, on_done, user, err);
    stop_all(h, xs, n);
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < n; i++) {
        free(xs[i].url);
        if (rc && !reqs[i].nbytes) { /* a failed batch hands back no partial bodies */
            free(reqs[i].body);
            reqs[i].body = NULL;
        }
    }
    free(xs);
    return rc;
}
