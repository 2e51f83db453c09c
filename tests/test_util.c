#include "test.h"
#include "../src/util/err.h"

#include <string.h>

static void test_err_message_and_code(void) {
    k3_err err = {0};
    int rc = k3_fail(&err, K3_ERR_CHECKPOINT, "%s: tensor %s missing", "a.safetensors", "x");
    CHECK(rc == K3_ERR_CHECKPOINT && err.code == K3_ERR_CHECKPOINT);
    CHECK(strcmp(err.msg, "a.safetensors: tensor x missing") == 0, "got '%s'", err.msg);
    k3_err_prefix(&err, "loading %s", "model");
    CHECK(strcmp(err.msg, "loading model: a.safetensors: tensor x missing") == 0, "got '%s'",
          err.msg);
}

const k3_test k3_suite_util[] = {{"err_message_and_code", test_err_message_and_code}, {0}};
