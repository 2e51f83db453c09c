/* interrupt.h — Ctrl-C at the edge: the one SIGINT (and, for `k3 serve`, SIGTERM) flag of the
 * command-line tool. The library never installs a handler: it takes a
 * `volatile sig_atomic_t *` (k3_session_set_interrupt, k3_gen_opts.interrupt,
 * k3_setup_opts.interrupt) and checks it at its own safe points.
 *
 * Invariants:
 *  - The handler only sets k3_cli_interrupted and writes a byte to a pipe, so a thread
 *    waiting in poll() (k3_cli_sigint_fd) wakes up whichever thread the signal was delivered
 *    to (OpenMP and expert-reader threads do not block SIGINT).
 *  - Without K3_CLI_SIG_RESTART a blocking call in the receiving thread returns EINTR (the
 *    chat's read of stdin, setup's transfers); with it, reads and writes resume (k3 pack).
 */
#ifndef K3_CLI_INTERRUPT_H
#define K3_CLI_INTERRUPT_H

#include <signal.h>

/* Set by the handler (the one piece of CLI-level mutable state). */
extern volatile sig_atomic_t k3_cli_interrupted;

enum {
    K3_CLI_SIG_TERM = 1,    /* SIGTERM sets the flag too (a server asked to stop) */
    K3_CLI_SIG_RESTART = 2, /* SA_RESTART: interrupted system calls resume */
};

/* Installs the handler for SIGINT (and what flags add) and clears the flag. */
void k3_cli_catch_signals(int flags);
/* k3_cli_catch_signals(0). */
void k3_cli_catch_sigint(void);
/* SIGINT's default action again (Ctrl-C ends the process). */
void k3_cli_default_sigint(void);
/* The read end of the wake-up pipe (-1 before a handler is installed). */
int k3_cli_sigint_fd(void);
/* Clears the flag and empties the pipe (before waiting for the next Ctrl-C). */
void k3_cli_clear_sigint(void);

#endif
