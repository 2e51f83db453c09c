/* sigbus.c — surviving SIGBUS on a truncated mapped file (see sigbus.h). */
#include "sigbus.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/mman.h>
#include <unistd.h>

static atomic_uint_fast64_t n_faults;
static _Atomic(uintptr_t) last_addr;
static atomic_int armed;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_rc = -1;
static long page_bytes;

static void on_sigbus(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    uintptr_t a = (uintptr_t)si->si_addr;
    if (atomic_load(&armed) > 0 && si->si_code == BUS_ADRERR && page_bytes > 0) {
        void *page = (void *)(a & ~(uintptr_t)(page_bytes - 1));
        /* mmap is a plain system call here: safe enough in a handler on Linux. */
        if (mmap(page, (size_t)page_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0) != MAP_FAILED) {
            atomic_store(&last_addr, a);
            atomic_fetch_add(&n_faults, 1);
            return; /* the faulting read is retried and finds zeros */
        }
    }
    signal(sig, SIG_DFL); /* not ours: the access faults again and the process dies as before */
}

static void install(void) {
    page_bytes = sysconf(_SC_PAGESIZE);
    struct sigaction sa = {0};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    install_rc = sigaction(SIGBUS, &sa, NULL) == 0 ? 0 : -1;
}

int k3_sigbus_install(void) {
    pthread_once(&once, install);
    return install_rc;
}

void k3_sigbus_arm(void) { atomic_fetch_add(&armed, 1); }
void k3_sigbus_disarm(void) { atomic_fetch_sub(&armed, 1); }
uint64_t k3_sigbus_faults(void) { return atomic_load(&n_faults); }
const void *k3_sigbus_last_addr(void) { return (const void *)atomic_load(&last_addr); }
