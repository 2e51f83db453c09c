/* sigbus.h — a read through a file mapping past the end of a file that was truncated while
 * mapped (SIGBUS) becomes an I/O error of the step instead of killing the process (issue 20,
 * D2). Robust engines do the same: the fault is survived, the step's result discarded.
 *
 * Invariants:
 *  - Only faults while a guard is armed (k3_sigbus_arm .. k3_sigbus_disarm, e.g. around one
 *    forward step, from any thread: OpenMP workers included) are survived. The handler maps
 *    a zero page over the faulting page, so the computation finishes with garbage; the
 *    caller sees k3_sigbus_faults() change, discards the result and restores its mappings
 *    (the zero page would otherwise stay in place of the file's bytes).
 *  - Any other SIGBUS (not armed, or not "address past the object", BUS_ADRERR) kills the
 *    process as before: the default action is restored and the access faults again.
 *  - Process-wide state (the one exception to "no global mutable state": a signal handler
 *    has no other place to put it): an atomic fault count, the last faulting address, and
 *    the number of armed guards.
 */
#ifndef K3_UTIL_SIGBUS_H
#define K3_UTIL_SIGBUS_H

#include <stdint.h>

/* Installs the handler once per process (later calls do nothing). Returns 0, or -1 when
 * sigaction failed (then faults kill the process as before). */
int k3_sigbus_install(void);

/* Arms / disarms the handler around reads from mappings (nesting and threads add up). */
void k3_sigbus_arm(void);
void k3_sigbus_disarm(void);

/* Faults survived so far, and the address of the last one (NULL before any). */
uint64_t k3_sigbus_faults(void);
const void *k3_sigbus_last_addr(void);

#endif
