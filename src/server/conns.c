/* conns.c — accepted connections: caps and the request deadline (conns.h). */
#include "conns.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "../util/clock.h"

#define K3_WATCH_TICK_MS 250 /* how often the watchdog looks at the deadlines */

typedef struct k3_conn_watch {
    int fd;
    uint8_t addr[16];  /* the client's address (IPv4: 4 bytes; IPv4-mapped IPv6 as IPv4) */
    int addr_len;
    double deadline;   /* monotonic seconds; 0 while a request is being answered */
    bool answered;     /* a request on it was answered (it is kept alive) */
    bool refused;      /* over a cap: its request is answered 503 */
    bool fired;        /* the deadline passed: answered 408 (or closed) and shut down */
    struct k3_conn_watch *prev, *next;
} k3_conn_watch;

typedef struct k3_conns {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool stop, started;
    k3_conn_watch *head;
} k3_conns;

/* ---- caps ------------------------------------------------------------------------------- */

static void client_key(struct MHD_Connection *c, k3_conn_watch *w) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    w->addr_len = 0;
    if (sa && sa->sa_family == AF_INET) {
        memcpy(w->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        w->addr_len = 4;
    } else if (sa && sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) memcpy(w->addr, a->s6_addr + 12, 4), w->addr_len = 4;
        else memcpy(w->addr, a->s6_addr, 16), w->addr_len = 16;
    }
}

static int per_address_cap(const k3_server *s) {
    if (s->o.max_per_address > 0) return s->o.max_per_address;
    return s->o.max_connections / 8 > 4 ? s->o.max_connections / 8 : 4;
}

unsigned k3_conns_mhd_limit(const k3_server *s) {
    int n = s->o.max_connections, margin = n / 4 > 16 ? n / 4 : 16;
    return (unsigned)(n + margin);
}

unsigned k3_conns_mhd_per_address(const k3_server *s) {
    int n = per_address_cap(s), margin = n / 4 > 4 ? n / 4 : 4;
    return (unsigned)(n + margin);
}

/* With k->mu held: whether w, newly accepted, is over a cap (admitted ones count). */
static bool over_cap_locked(const k3_server *s, const k3_conns *k, const k3_conn_watch *w) {
    int total = 0, same = 0;
    for (const k3_conn_watch *e = k->head; e; e = e->next) {
        if (e->refused || e->fired) continue;
        total++;
        same += e->addr_len == w->addr_len && !memcmp(e->addr, w->addr, (size_t)w->addr_len);
    }
    return total >= s->o.max_connections || same >= per_address_cap(s);
}

void k3_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code) {
    k3_server *s = cls;
    k3_conns *k = s->conns;
    if (!k) return;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        k3_conn_watch *w = calloc(1, sizeof *w);
        if (!w) return; /* untracked: no deadline, not counted */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        w->fd = ci ? ci->connect_fd : -1;
        client_key(c, w);
        w->deadline = k3_now_s() + s->o.request_timeout_s;
        pthread_mutex_lock(&k->mu);
        w->refused = over_cap_locked(s, k, w);
        w->next = k->head;
        if (k->head) k->head->prev = w;
        k->head = w;
        pthread_mutex_unlock(&k->mu);
        *socket_context = w;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        k3_conn_watch *w = *socket_context;
        pthread_mutex_lock(&k->mu); /* after this the watchdog cannot reach w->fd */
        if (w->prev) w->prev->next = w->next;
        else k->head = w->next;
        if (w->next) w->next->prev = w->prev;
        pthread_mutex_unlock(&k->mu);
        free(w);
        *socket_context = NULL;
    }
}

static k3_conn_watch *watch_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

bool k3_conns_refused(struct MHD_Connection *c) {
    const k3_conn_watch *w = watch_of(c);
    return w && w->refused; /* set once, before the connection's thread starts */
}

bool k3_conns_dispatch(k3_server *s, struct MHD_Connection *c) {
    k3_conn_watch *w = watch_of(c);
    if (!w || !s->conns) return true;
    pthread_mutex_lock(&s->conns->mu);
    bool ok = !w->fired;
    w->deadline = 0;
    pthread_mutex_unlock(&s->conns->mu);
    return ok;
}

void k3_conns_request_done(k3_server *s, struct MHD_Connection *c) {
    k3_conn_watch *w = watch_of(c);
    if (!w || !s->conns) return;
    pthread_mutex_lock(&s->conns->mu);
    w->answered = true;
    w->deadline = k3_now_s() + K3_IDLE_TIMEOUT_S + s->o.request_timeout_s;
    pthread_mutex_unlock(&s->conns->mu);
}

/* ---- the watchdog ------------------------------------------------------------------------ */

/* With k->mu held: w's deadline passed. A first request is answered 408; a kept-alive
 * connection whose next request did not arrive whole is just closed (it may have sent
 * nothing). Shutting the socket down wakes its connection thread, which closes it. */
static void fire_locked(k3_server *s, k3_conn_watch *w) {
    w->fired = true;
    if (w->fd < 0) return;
    if (!w->answered) {
        static const char body[] =
            "{\"error\":{\"message\":\"the request's headers and body did not arrive within "
            "the server's deadline (k3 serve --request-timeout)\",\"type\":"
            "\"invalid_request_error\",\"param\":null,\"code\":\"request_timeout\"}}\n";
        char msg[512];
        int n = snprintf(msg, sizeof msg, "HTTP/1.1 408 Request Timeout\r\nContent-Type: "
                         "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                         sizeof body - 1, body);
        if (send(w->fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* gone: fine */ }
        pthread_mutex_lock(&s->mu);
        k3_metrics_request(&s->metrics, NULL, 408);
        pthread_mutex_unlock(&s->mu);
        if (s->o.log_requests)
            fprintf(stderr, "k3 serve: 408: a request's headers and body took longer than "
                    "--request-timeout %g s; connection closed\n", s->o.request_timeout_s);
    }
    shutdown(w->fd, SHUT_RDWR);
}

static void *watchdog(void *arg) {
    k3_server *s = arg;
    k3_conns *k = s->conns;
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += K3_WATCH_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&k->cv, &k->mu, &ts);
        double now = k3_now_s();
        for (k3_conn_watch *w = k->head; w; w = w->next)
            if (!w->fired && w->deadline > 0 && now >= w->deadline) fire_locked(s, w);
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

int k3_conns_start(k3_server *s, k3_err *err) {
    k3_conns *k = calloc(1, sizeof *k);
    if (!k) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    s->conns = k;
    if (pthread_create(&k->thread, NULL, watchdog, s))
        return k3_fail(err, K3_ERR_GENERIC, "cannot start the connection watchdog thread");
    k->started = true;
    return 0;
}

void k3_conns_stop(k3_server *s) {
    k3_conns *k = s->conns;
    if (!k) return;
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    if (k->started) pthread_join(k->thread, NULL);
    while (k->head) { /* none after MHD_stop_daemon; kept safe anyway */
        k3_conn_watch *w = k->head;
        k->head = w->next;
        free(w);
    }
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k);
    s->conns = NULL;
}
