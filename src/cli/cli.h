/* cli.h — subcommands of the k3 command-line tool. Each takes the arguments after its
 * name (argv[0] is the subcommand name), prints to stdout/stderr and returns the process
 * exit status (0, or a k3_status code). The developer commands are in src/lab/lab.h. */
#ifndef K3_CLI_H
#define K3_CLI_H

/* every command that loads a model falls back to the bundled one (model_dir.h) */
#include "model_dir.h"

int k3_cmd_run(int argc, char **argv);
int k3_cmd_chat(int argc, char **argv);
int k3_cmd_render(int argc, char **argv);
int k3_cmd_tokenize(int argc, char **argv);
int k3_cmd_detokenize(int argc, char **argv);
int k3_cmd_serve(int argc, char **argv);
int k3_cmd_setup(int argc, char **argv);
int k3_cmd_quality(int argc, char **argv);
int k3_cmd_pack(int argc, char **argv);
/* k3 plan: the memory plan without reading a weight (cmd_plan.c). */
int k3_cmd_plan(int argc, char **argv);
/* k3 version / k3 --version (cmd_version.c). */
int k3_cmd_version(int argc, char **argv);

#endif
