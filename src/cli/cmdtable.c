/* cmdtable.c — see cmdtable.h. */
#include "cmdtable.h"

#include <string.h>

#include "../util/err.h"
#include "waitpolicy.h"

void k3_program_usage(const k3_program *p, FILE *f) {
    fprintf(f, "%s\n\nusage: %s <command> [options]\n\ncommands:\n", p->title, p->name);
    for (const k3_command *c = p->cmds; c->name; c++)
        if (c->synopsis && c->run) fprintf(f, "  %-31s %s\n", c->synopsis, c->help);
    fprintf(f, "\n%s", p->epilogue);
}

/* Edit distance of a and b, capped at 3 (enough to spot a typo). */
static int distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 32 || lb > 32 || (la > lb ? la - lb : lb - la) > 2) return 3;
    int d[33][33];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]), del = d[i - 1][j] + 1,
                ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb] < 3 ? d[la][lb] : 3;
}

/* One line on stderr: what was not understood, the closest command when it looks like a typo
 * (a moved one with its program's name), and where the list is. */
static void unknown_command(const k3_program *p, const char *cmd) {
    const k3_command *best = NULL;
    const char *word = cmd + strspn(cmd, "-"); /* --verison: version */
    int best_d = distance(word, "help");
    for (const k3_command *c = p->cmds; c->name; c++) {
        int d = distance(word, c->name + strspn(c->name, "-"));
        if (d < best_d) best_d = d, best = c;
    }
    char hint[96] = "";
    if (best)
        snprintf(hint, sizeof hint, " (did you mean '%s%s%s'?)", best->moved_to ? best->moved_to
                 : "", best->moved_to ? " " : "", best->name + strspn(best->name, "-"));
    else if (best_d < 3)
        snprintf(hint, sizeof hint, " (did you mean 'help'?)");
    fprintf(stderr, "%s: unknown command '%s'%s; %s --help lists the commands\n", p->name, cmd,
            hint, p->name);
}

/* Whether word is one of the space-separated words of list. */
static int in_list(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *s = list; *s;) {
        size_t len = strcspn(s, " ");
        if (len == n && !strncmp(s, word, n)) return 1;
        s += len + (s[len] == ' ');
    }
    return 0;
}

int k3_program_main(const k3_program *p, int argc, char **argv) {
    if (argc < 2) {
        k3_program_usage(p, stderr);
        return K3_ERR_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        k3_program_usage(p, stdout);
        return 0;
    }
    for (const k3_command *c = p->cmds; c->name; c++) {
        if (strcmp(c->name, cmd)) continue;
        if (c->subs && !(argc > 2 && in_list(c->subs, argv[2]))) continue;
        if (!c->run) {
            fprintf(stderr, "%s: '%s' moved to the developer binary %s (built by make beside "
                    "k3): run %s", p->name, cmd, c->moved_to, c->moved_to);
            for (int i = 1; i < argc; i++) fprintf(stderr, " %s", argv[i]);
            fputc('\n', stderr);
            return K3_ERR_USAGE;
        }
        if (c->threads) k3_wait_policy_apply(argv);
        return c->subs ? c->run(argc - 2, argv + 2) : c->run(argc - 1, argv + 1);
    }
    unknown_command(p, cmd);
    return K3_ERR_USAGE;
}
