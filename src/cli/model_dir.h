/* model_dir.h — where the bundled fixture model is, for commands given no MODEL_DIR (k3 and
 * k3-lab both use it). */
#ifndef K3_CLI_MODEL_DIR_H
#define K3_CLI_MODEL_DIR_H

/* The bundled model's folder, relative to the repository root. */
#define K3_BUNDLED_MODEL "tests/fixtures/k3-tiny-kjv"

/* The bundled fixture model's folder: K3_BUNDLED_MODEL beside the executable, or one folder up
 * (build/k3), else relative to the working directory. When none of them holds a config.json,
 * prints one line on stderr saying how to give a model folder and still returns the relative
 * path (the command's own open then fails with the I/O error). The string is static: call it
 * from the main thread before any other thread starts. */
const char *k3_default_model_dir(void);

#endif
