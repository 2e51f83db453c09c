/* cli.h — subcommands of the k3 command-line tool. Each takes the arguments after its
 * name (argv[0] is the subcommand name), prints to stdout/stderr and returns the process
 * exit status (0, or a k3_status code). */
#ifndef K3_CLI_H
#define K3_CLI_H

int k3_cmd_run(int argc, char **argv);
int k3_cmd_chat(int argc, char **argv);
int k3_cmd_render(int argc, char **argv);
int k3_cmd_tokenize(int argc, char **argv);
int k3_cmd_detokenize(int argc, char **argv);
int k3_cmd_serve(int argc, char **argv);
int k3_cmd_setup(int argc, char **argv);
int k3_cmd_quality(int argc, char **argv);
int k3_cmd_pack(int argc, char **argv);
int k3_cmd_synth(int argc, char **argv);
/* k3 bench kernels / k3 bench decode (cmd_bench_kernels.c); argv[0] is "kernels" or "decode". */
int k3_cmd_bench_compute(int argc, char **argv);
int k3_cmd_replay(int argc, char **argv);
int k3_cmd_tracegen(int argc, char **argv);
int k3_cmd_bench(int argc, char **argv);
int k3_cmd_bench_batch(int argc, char **argv); /* bench prefill | spec */
int k3_cmd_bench_gpu(int argc, char **argv);
/* k3 version / k3 --version (cmd_version.c). */
int k3_cmd_version(int argc, char **argv);

/* The bundled fixture model's folder (tests/fixtures/k3-tiny-kjv beside the executable, else
 * relative to the working directory); used when no MODEL_DIR is given. */
const char *k3_default_model_dir(void);

#endif
