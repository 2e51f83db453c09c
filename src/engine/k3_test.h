/* k3_test.h — engine internals that only tests reach (never included under src/; the
 * architecture test, tests/test_arch.c, enforces it). */
#ifndef K3_ENGINE_TEST_H
#define K3_ENGINE_TEST_H

#include "k3.h"

/* The engine's expert store (src/store/store.h), e.g. to install a read hook or read its
 * slot count. */
struct k3_store *k3_engine_store(const k3_engine *e);

/* The engine's bound model (src/model/model.h), e.g. to install the expanded MLA oracle
 * (k3_model.mla_oracle) before any session runs. */
struct k3_model *k3_engine_model(k3_engine *e);

#endif
