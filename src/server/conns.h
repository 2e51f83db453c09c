/* conns.h — `k3 serve`'s accepted connections (issue 32, D15): the connection caps and the
 * deadline for a request's headers and body.
 *
 * Invariants:
 *  - At most opts.max_connections connections are admitted, at most opts.max_per_address
 *    of them from one client address (IPv4-mapped IPv6 counted as IPv4). A connection over a
 *    cap is still read up to its headers and answered 503 with Retry-After and closed, not
 *    dropped silently; only past the caps plus a margin (a quarter, >= 16 in all and >= 4 per
 *    address) does libmicrohttpd close connections unanswered.
 *  - Every request's headers and body must arrive within opts.request_timeout_s of the
 *    connection's accept (or, on a kept-alive connection, of the previous answer's end plus
 *    the idle timeout), however slowly they trickle; past it the request is answered 408 and
 *    the connection shut down. A watchdog thread looks every 250 ms, so a connection lives at
 *    most that much past its deadline. The deadline stops while a request is answered (a
 *    generation, a stream: those have their own limits, server.h).
 *  - A shut-down socket is never touched after libmicrohttpd closes it: entries leave the
 *    watch list (under its lock) in the close notification, which libmicrohttpd sends before
 *    it closes the socket.
 */
#ifndef K3_SERVER_CONNS_H
#define K3_SERVER_CONNS_H

#include <microhttpd.h>
#include <stdbool.h>

#include "srv.h"

#define K3_REQUEST_TIMEOUT_S 30 /* default --request-timeout */
#define K3_IDLE_TIMEOUT_S 60    /* an idle keep-alive connection is closed after this */

/* Starts the watchdog thread (s->conns). Errors: K3_ERR_GENERIC (memory, thread). */
int k3_conns_start(struct k3_server *s, k3_err *err);
/* Stops the watchdog and frees the list; call after MHD_stop_daemon. NULL-safe. */
void k3_conns_stop(struct k3_server *s);

/* MHD_OPTION_NOTIFY_CONNECTION's callback (cls = the server). */
void k3_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code);
/* libmicrohttpd's own limits: the caps plus the margin above. */
unsigned k3_conns_mhd_limit(const struct k3_server *s);
unsigned k3_conns_mhd_per_address(const struct k3_server *s);

/* 1 when connection c is over a cap (its request is answered 503). */
bool k3_conns_refused(struct MHD_Connection *c);
/* The request on c has arrived whole: its deadline stops. false when the deadline passed
 * already (the connection was answered 408: the caller answers nothing). */
bool k3_conns_dispatch(struct k3_server *s, struct MHD_Connection *c);
/* The request on c was answered: a kept-alive connection's next deadline starts. */
void k3_conns_request_done(struct k3_server *s, struct MHD_Connection *c);

#endif
