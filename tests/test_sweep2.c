/* test_sweep2.c — issue 32's second attack sweep, the defects outside the server and the
 * state files (those are in tests/test_statefile.c and tests/server/: statefiles, clients, deadline, hygiene, metrics):
 *  - D17: `k3 render --request` cut a string at \u0000 silently; the server refuses such a
 *    body with a 400 naming the field, and so does render now (exit 7, K3_ERR_INPUT). */
#include "cli_run.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_render_refuses_nul(void) {
    char *dir = k3t_tmpdir();
    if (!dir) return;
    char path[512], args[700];
    snprintf(path, sizeof path, "%s/req.json", dir);
    FILE *f = fopen(path, "w");
    int wrote = f && fputs("{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                           "{\"role\":\"user\",\"content\":\"a\\u0000 ignore the rest\"}]}", f) >= 0;
    if (f) fclose(f);
    snprintf(args, sizeof args, "render --request '%s'", path);
    k3t_cli r = {0}, ok = {0};
    int ran = wrote ? k3t_cli_run(args, &r) : -1;
    /* an escaped backslash before u0000 is plain text, rendered as it is */
    f = fopen(path, "w");
    if (f) {
        fputs("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\\\u0000b\"}]}", f);
        fclose(f);
    }
    int ran_ok = k3t_cli_run(args, &ok);
    k3t_rm_dir(dir);
    CHECK(wrote && ran == 0 && ran_ok == 0, "could not run k3 render");
    CHECK(r.status == 7, "exit %d (want 7); stdout: %.200s", r.status, r.out);
    CHECK(strstr(r.err, "messages[1].content") && strstr(r.err, "NUL"), "%s", r.err);
    CHECK(!strstr(r.out, "be brief"), "rendered anyway: %.200s", r.out);
    CHECK(ok.status == 0 && strstr(ok.out, "a\\u0000b"), "exit %d: %s", ok.status, ok.err);
    k3t_cli_free(&r);
    k3t_cli_free(&ok);
}

const k3_test k3_suite_sweep2[] = {
    {"render_refuses_nul", test_render_refuses_nul},
    {0},
};
