/* pack_helpers.h — shared by test_pack.c and test_quality.c: temporary folders, running the
 * k3 binary, whole-file reads, and a pack of k3-nano built once per test process (never inside
 * the fixture folder). */
#ifndef K3_PACK_HELPERS_H
#define K3_PACK_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#define NANO "tests/fixtures/k3-nano"

/* A fresh folder under $TMPDIR (or /tmp); malloc'd path, NULL (test failed) on error. */
char *ph_tmpdir(void);
/* Removes a folder made by ph_tmpdir and the plain files in it. */
void ph_rmdir(const char *dir);
/* dir + "/" + name, malloc'd. */
char *ph_join(const char *dir, const char *name);

/* Runs "$K3_BIN ARGS" through the shell with stdout and stderr captured; returns the exit
 * status (-1 if it could not run). *out / *err (may be NULL) get malloc'd copies. */
int ph_k3(const char *args, char **out, char **err);

/* The whole file, malloc'd (NULL if missing); *len its size. */
uint8_t *ph_read(const char *path, size_t *len);
/* Writes len bytes; returns 0 on success. */
int ph_write(const char *path, const uint8_t *b, size_t len);
/* Copies every plain file of src into dst (existing folder); returns 0 on success. */
int ph_copy_dir(const char *src, const char *dst);

/* Copies k3-nano into a fresh folder (*dir) and finds tensor `name` in the copy: *shard its
 * shard's path, *offset its first byte in that file (all malloc'd / set on success). Returns 0,
 * or -1 with the test failed and nothing left to free or remove. For tests that cut or patch a
 * shard at a known tensor. */
int ph_nano_tensor(const char *name, char **dir, char **shard, uint64_t *offset);

/* The generated real-width model: *model = K3_WIDE_DIR and, when ref is not NULL, *ref =
 * K3_WIDE_REF (default ../shared/fixtures/k3-wide/reference). Returns 1 when they exist, else
 * 0 with the calling test skipped and the reason given. */
int ph_wide(const char **model, const char **ref);

/* A folder holding a complete pack of k3-nano with its quality file, built on first use by
 * `k3 pack` and removed at exit; NULL (and the calling test skipped/failed) if unavailable. */
const char *ph_nano_pack(void);
/* The same for tests/fixtures/k3-tiny-kjv (KJV). */
#define KJV_DIR "tests/fixtures/k3-tiny-kjv"
const char *ph_kjv_pack(void);

#endif
