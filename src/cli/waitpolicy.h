/* waitpolicy.h — how OpenMP's idle threads wait, chosen before the OpenMP runtime starts.
 *
 * libgomp's default lets a thread that reaches a barrier spin for about 300,000 iterations
 * (a few ms) before it sleeps. On a quiet machine that is harmless; on a loaded one the
 * spinning thread holds a core that the thread it waits for needs, and one `k3 run` on a
 * loaded 2-core machine took 73 s instead of 1 s. k3 therefore bounds the spin to
 * K3_SPINCOUNT_DEFAULT iterations (BENCHMARKS.md, "Threads on a busy machine", has the
 * measurements behind the figure) unless the user chose a policy with OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT.
 *
 * libgomp reads both variables in its load-time constructor, before main runs, so setting
 * them from main has no effect on the running process (and there is no OpenMP call to change
 * them later): k3_wait_policy_apply sets GOMP_SPINCOUNT and re-executes the same binary
 * (/proc/self/exe) with the same arguments once. The variable being set afterwards is what
 * stops a second re-exec; a user who sets either variable pays no re-exec. */
#ifndef K3_CLI_WAITPOLICY_H
#define K3_CLI_WAITPOLICY_H

/* GOMP_SPINCOUNT when the user set neither variable (iterations of libgomp's pause loop). */
#define K3_SPINCOUNT_DEFAULT "1000"

/* Call before anything that could start threads (cmdtable.c does, for the commands whose row
 * says they run the model's threads: a re-exec costs ~30 ms of dynamic loading, which `k3
 * version` or `k3 tokenize` need not pay). When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is
 * set, sets GOMP_SPINCOUNT=K3_SPINCOUNT_DEFAULT and re-executes argv (main's) through
 * /proc/self/exe; returns only when nothing was to be done or the re-exec failed (then the
 * process keeps libgomp's default and says nothing: the policy changes speed, never
 * results). */
void k3_wait_policy_apply(char **argv);

#endif
