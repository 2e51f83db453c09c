/* model_dir.h — the model folder a command works on: the bundled fixture model when given
 * none (k3 and k3-lab both use it), a folder as given, or a Hugging Face repository id looked
 * up in the hub cache and in k3 setup's default folder (src/setup/setup.h, part 4). The
 * variables that locate models (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME, K3_MODELS,
 * XDG_DATA_HOME) are read in model_dir.c and nowhere else. */
#ifndef K3_CLI_MODEL_DIR_H
#define K3_CLI_MODEL_DIR_H

#include <stddef.h>

/* The bundled model's folder, relative to the repository root. */
#define K3_BUNDLED_MODEL "tests/fixtures/k3-tiny-kjv"
/* ... and relative to an installed k3 (PREFIX/bin/k3: PREFIX/share/k3/k3-tiny-kjv; make
 * install puts it there). */
#define K3_INSTALLED_MODEL "../share/k3/k3-tiny-kjv"

/* The bundled fixture model's folder: K3_BUNDLED_MODEL beside the executable, or one folder up
 * (build/k3), or K3_INSTALLED_MODEL from the executable's folder (an installed k3), else
 * relative to the working directory. When none of them holds a config.json,
 * prints one line on stderr saying how to give a model folder and still returns the relative
 * path (the command's own open then fails with the I/O error). The string is static: call it
 * from the main thread before any other thread starts. */
const char *k3_default_model_dir(void);

/* The folder a command's MODEL argument names (setup.h, k3_model_resolve; the one door for k3
 * and k3-lab): arg NULL is the bundled model (k3_default_model_dir); an existing path, or
 * anything that is no model name, is arg itself; OWNER/NAME is the newest complete snapshot
 * in the Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else
 * XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub), else K3_MODELS/OWNER/NAME
 * (k3_cli_models_dir); OWNER/NAME@REV is that revision (a branch, tag or commit) or an error.
 * A note about a newer, incomplete snapshot passed over goes to stderr. cmd is the command as
 * messages name it ("k3 run", "k3-lab bench io"). Returns 0 with *dir set (static storage,
 * valid until the next call; main thread only), or the exit status after printing
 * "CMD: <why>" on stderr. */
int k3_model_arg(const char *cmd, const char *arg, const char **dir);

/* Where k3 setup installs by default, K3_MODELS, else XDG_DATA_HOME/k3/models, else
 * ~/.local/share/k3/models; "" when none is known. Returns buf. */
char *k3_cli_models_dir(char *buf, size_t cap);

/* k3 setup's DEST when none is given: k3_cli_models_dir()/repo for revision NULL or main, else
 * k3_cli_models_dir()/repo@revision (each revision in its own folder, so that installing one
 * never meets another's), where k3_model_arg finds it by name (repo, or repo@revision); says so
 * on stderr. Returns 0 with *dest set (static storage), or 2 after printing why there is none
 * (repo is no OWNER/NAME, revision has a '/', or HOME is unset). */
int k3_setup_default_dest(const char *repo, const char *revision, const char **dest);

#endif
