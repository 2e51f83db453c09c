/* interrupt.c — the CLI's SIGINT / SIGTERM flag (see interrupt.h). */
#include "interrupt.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

volatile sig_atomic_t k3_cli_interrupted;
static int sigint_pipe[2] = {-1, -1}; /* CLI-level, like the flag: the handler's wake-up */

static void on_signal(int sig) {
    (void)sig;
    int saved = errno;
    k3_cli_interrupted = 1;
    if (sigint_pipe[1] >= 0 && write(sigint_pipe[1], "!", 1) < 0) { /* full: already awake */ }
    errno = saved;
}

void k3_cli_catch_signals(int flags) {
    if (sigint_pipe[0] < 0 && pipe2(sigint_pipe, O_NONBLOCK | O_CLOEXEC) != 0)
        sigint_pipe[0] = sigint_pipe[1] = -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = flags & K3_CLI_SIG_RESTART ? SA_RESTART : 0;
    sigaction(SIGINT, &sa, NULL);
    if (flags & K3_CLI_SIG_TERM) sigaction(SIGTERM, &sa, NULL);
    k3_cli_clear_sigint();
}

void k3_cli_catch_sigint(void) { k3_cli_catch_signals(0); }

void k3_cli_default_sigint(void) { signal(SIGINT, SIG_DFL); }

int k3_cli_sigint_fd(void) { return sigint_pipe[0]; }

void k3_cli_clear_sigint(void) {
    char drain[64];
    while (sigint_pipe[0] >= 0 && read(sigint_pipe[0], drain, sizeof drain) > 0) {}
    k3_cli_interrupted = 0;
}
