/* waitpolicy.c — see waitpolicy.h. */
#include "waitpolicy.h"

#include <stdlib.h>
#include <unistd.h>

void k3_wait_policy_apply(char **argv) {
    const char *wp = getenv("OMP_WAIT_POLICY"), *sc = getenv("GOMP_SPINCOUNT");
    if ((wp && *wp) || (sc && *sc)) return;
    if (setenv("GOMP_SPINCOUNT", K3_SPINCOUNT_DEFAULT, 1)) return;
    execv("/proc/self/exe", argv);
    unsetenv("GOMP_SPINCOUNT"); /* exec failed: this process runs libgomp's default */
}
