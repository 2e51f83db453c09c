# k3 — build, test and sanitizer targets. `make` builds ./k3 and the developer binary ./k3-lab
# (benchmarks, synth, replay, trace-gen, bench-gpu: src/lab); `make test` runs every test.
CC      ?= cc
CFLAGS  ?= -O2 -g
override CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -ffp-contract=off -fno-fast-math \
           -fopenmp -MMD -MP
LDLIBS  += -lcjson -lpcre2-8 -lmicrohttpd -lcurl -lcrypto -lxxhash -luring -lm -fopenmp
# `make CUDA=1` adds the GPU backend (src/cuda, backend.h) in its own build folder: nvcc
# builds sm_90 code for Hopper plus compute_90 PTX that the driver compiles for other cards.
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
NVCCFLAGS ?= -O3 -std=c++17 -Xcompiler -Wall,-Wextra -Werror all-warnings \
             -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
ifeq ($(CUDA),1)
BUILD   ?= build-cuda
override CFLAGS += -DK3_WITH_CUDA -I$(CUDA_HOME)/include
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
CU_SRC  := $(wildcard src/cuda/*.cu)
endif
# `make MPI=1` builds k3 with mpicc in build-mpi/ and adds expert parallelism over MPI
# (src/dist; `mpirun -np N build-mpi/k3 run ...`); launched without mpirun it runs as one process.
MPICC ?= mpicc
ifeq ($(MPI),1)
ifeq ($(shell command -v $(MPICC) 2>/dev/null),)
$(error MPI=1: $(MPICC) not found: apt-get install openmpi-bin libopenmpi-dev (scripts/install-deps.sh))
endif
BUILD   ?= build-mpi
CC      := $(MPICC)
override CFLAGS += -DK3_WITH_MPI
endif
# `make TEST_CONTROLS=1` (build/k3-test, which tests/server and tests/web run) compiles in the
# server's test controls (server.h, k3_server_test_control); the shipped k3 has none.
ifeq ($(TEST_CONTROLS),1)
override CFLAGS += -DK3_TEST_CONTROLS
endif
BUILD   ?= build

# src/lab is k3-lab's alone: the shipped k3 links none of it.
LIB_SRC  := $(sort $(filter-out src/cli/main.c src/lab/%,$(wildcard src/*/*.c)))
LAB_SRC  := $(sort $(wildcard src/lab/*.c))
ifneq ($(MPI),1)
LIB_SRC  := $(filter-out src/dist/%,$(LIB_SRC))
endif
ifneq ($(CUDA),1)
LIB_SRC  := $(filter-out src/cuda/%,$(LIB_SRC))
LAB_SRC  := $(filter-out src/lab/cuda_%,$(LAB_SRC))
endif
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.o)
CLI_SRC  := src/cli/main.c
TEST_SRC := $(sort $(wildcard tests/*.c))
# tests/test_NAME.c defines suite NAME (see tests/test_main.c).
SUITES   := $(patsubst tests/test_%.c,X(%),$(filter-out tests/test_main.c,$(wildcard tests/test_*.c)))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
# The web page (src/server/ui/) is compiled in as C arrays (scripts/embed.sh; ui.h).
UI_FILES := $(sort $(wildcard src/server/ui/*))
LIB_OBJ  += $(BUILD)/ui_assets.o
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
LAB_OBJ  := $(LAB_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: test-setup bench-setup
.PHONY: test-neon test-avx512-emu
.PHONY: all test test-wide test-server test-web test-agents bench-server asan bench clean deps FORCE
all: k3 k3-lab

# copied whenever it differs, so that ./k3 and ./k3-lab follow the last build's flavour
# (CUDA=1 or not)
k3: $(BUILD)/k3 FORCE
	@cmp -s $< $@ || cp $< $@

k3-lab: $(BUILD)/k3-lab FORCE
	@cmp -s $< $@ || cp $< $@

$(BUILD)/k3: $(CLI_OBJ) $(BUILD)/libk3.a
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# OpenBLAS is k3-lab's alone too: `bench kernels` times its sgemm as the batched products'
# yardstick (libopenblas-dev, scripts/install-deps.sh).
OPENBLAS_CFLAGS ?= $(shell pkg-config --cflags openblas 2>/dev/null)
OPENBLAS_LIBS   ?= $(or $(shell pkg-config --libs openblas 2>/dev/null),-lopenblas)
$(BUILD)/src/lab/cmd_bench_kernels.o: override CFLAGS += $(OPENBLAS_CFLAGS)
$(BUILD)/k3-lab: $(LAB_OBJ) $(BUILD)/libk3.a
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(OPENBLAS_LIBS)

$(BUILD)/libk3.a: $(LIB_OBJ) $(CU_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/%.o: %.cu src/cuda/kern.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

$(BUILD)/k3_tests: $(TEST_OBJ) $(BUILD)/libk3.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/ui_assets.c: $(UI_FILES) $(BUILD)/ui_files.txt scripts/embed.sh
	sh scripts/embed.sh $(UI_FILES) > $@.tmp && mv $@.tmp $@

# Re-embed when a file of the page is added or removed, too.
$(BUILD)/ui_files.txt: FORCE
	@mkdir -p $(BUILD)
	@echo '$(UI_FILES)' | cmp -s - $@ || echo '$(UI_FILES)' > $@

$(BUILD)/ui_assets.o: $(BUILD)/ui_assets.c src/server/ui.h
	$(CC) $(CPPFLAGS) $(CFLAGS) -Isrc -c -o $@ $<

$(BUILD)/tests/test_main.o: tests/test_main.c $(BUILD)/suites.txt
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) '-DK3_TEST_SUITES=$(SUITES)' -c -o $@ $<

# Rebuild test_main.o when the set of suites changes.
$(BUILD)/suites.txt: FORCE
	@mkdir -p $(BUILD)
	@echo '$(SUITES)' | cmp -s - $@ || echo '$(SUITES)' > $@

FORCE:

# Every test; the last line of output is "N passed, N failed". K3_LAB_BIN is the developer
# binary for the tests that run bench, synth, replay or trace-gen.
test: k3 k3-lab $(BUILD)/k3_tests
	K3_BIN=./k3 K3_LAB_BIN=./k3-lab $(BUILD)/k3_tests

# Expert parallelism over MPI (tests/mpi/run.sh): 2 and 3 ranks on this host bit-identical to
# one process, per-rank folders, serve, a killed and a hung rank. SKIPPED without mpirun.
.PHONY: test-mpi
test-mpi: k3
	@if command -v mpicc >/dev/null 2>&1; then $(MAKE) --no-print-directory MPI=1 build-mpi/k3 \
	    build-mpi/k3-test; fi
	K3_BIN=./k3 K3_MPI_BIN=build-mpi/k3 K3_MPI_TEST_BIN=build-mpi/k3-test sh tests/mpi/run.sh

# `k3 serve` through the official OpenAI client (tests/server, Node's test runner; needs
# node + npm, and the npm registry or its cache for `npm ci`).
test-server: k3 $(BUILD)/k3-test
	cd tests/server && npm ci --no-audit --no-fund --loglevel=error && \
	    K3_BIN=$(CURDIR)/$(BUILD)/k3-test K3_SHIPPED_BIN=$(CURDIR)/k3 \
	    node --test --test-concurrency=1 *.test.mjs

# The test build of k3: the same sources with the server's test controls (-DK3_TEST_CONTROLS)
# in a build folder of its own, so that no object of the shipped k3 has them.
$(BUILD)/k3-test: FORCE
	@$(MAKE) --no-print-directory TEST_CONTROLS=1 BUILD=$(BUILD)/test-controls \
	    $(BUILD)/test-controls/k3
	@cmp -s $(BUILD)/test-controls/k3 $@ || cp $(BUILD)/test-controls/k3 $@

# Claude Code, Codex and opencode (pinned in tests/agents/package.json, installed once into
# tests/agents/node_modules) each run a tool round trip against `k3 serve` on the bundled model
# (~20 s once installed). SKIPPED with the reason without npm, or when the clients are not
# installed and the registry is unreachable.
test-agents: k3 $(BUILD)/k3-test
	@if ! command -v npm >/dev/null 2>&1; then \
	    echo "SKIPPED test-agents: npm is missing (scripts/install-deps.sh installs it)"; \
	else \
	    node tests/agents/run.mjs; \
	fi

# The chat page (GET /) in a real headless Chromium driven by puppeteer-core (tests/web, ~1
# min); screenshots in build/web-artifacts/. SKIPPED with the reason without npm or Chromium
# (scripts/install-deps.sh --with-web). K3_WEB_DOCS_SHOT=docs/web-ui.png refreshes the README's.
CHROMIUM ?= /usr/bin/chromium
test-web: k3 $(BUILD)/k3-test
	@if ! command -v npm >/dev/null 2>&1; then \
	    echo "SKIPPED test-web: npm is missing (scripts/install-deps.sh installs it)"; \
	elif [ ! -x "$(CHROMIUM)" ]; then \
	    echo "SKIPPED test-web: no Chromium at $(CHROMIUM) (apt-get install chromium, or" \
	         "scripts/install-deps.sh --with-web; CHROMIUM=PATH picks another)"; \
	else \
	    cd tests/web && npm ci --no-audit --no-fund --loglevel=error && \
	    K3_BIN=$(CURDIR)/$(BUILD)/k3-test CHROMIUM=$(CHROMIUM) node --test --test-concurrency=1 *.test.mjs; \
	fi

# Bounded wrk load test of k3 serve on loopback: no crash, no lost request, stable RSS; then
# batched decoding across requests (--parallel N for N = 1, 2, 4, 8 beside the same requests
# one after another: tokens/s, latency, bytes read per token; tests/server/bench-batched.mjs,
# MODEL_DIR / SERVE_ARGS="--spine-gb 0" / BATCH_TOKENS pick the case).
bench-server: k3
	K3_BIN=./k3 tests/server/load.sh && QUEUE=8 K3_BIN=./k3 tests/server/load.sh
	K3_BIN=./k3 node tests/server/bench-batched.mjs

# The real-width model (7.1 GB, regenerated from ../shared); prints SKIPPED when it cannot run.
test-wide: k3 k3-lab $(BUILD)/k3_tests
	K3_BIN=./k3 K3_LAB_BIN=./k3-lab ./scripts/test-wide.sh $(BUILD)/k3_tests

# The same tests under AddressSanitizer + UndefinedBehaviorSanitizer, in a separate build dir.
asan:
	$(MAKE) BUILD=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
	    -fno-sanitize-recover=undefined" build-asan/k3 build-asan/k3-lab build-asan/k3_tests
	K3_BIN=build-asan/k3 K3_LAB_BIN=build-asan/k3-lab ASAN_OPTIONS=detect_leaks=1 \
	    build-asan/k3_tests

# Chat rendering time for 1k / 10k / 100k messages, argument keys and tool results (issue 20,
# D1): growth per 10x should be about 10x. Figures in BENCHMARKS.md.
.PHONY: bench-render
bench-render: $(BUILD)/bench_render
	$(BUILD)/bench_render

$(BUILD)/bench_render: scripts/bench_render.c $(BUILD)/libk3.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# `k3 setup` against nginx on loopback with a fault-injecting proxy (tests/setup/run.sh, ~40 s);
# prints SKIPPED with the reason when nginx or python3 is missing. K3_BIN picks the binary.
K3_BIN ?= ./k3
test-setup: k3 $(BUILD)/k3-test
	K3_BIN=$(K3_BIN) K3_TEST_BIN=$(BUILD)/k3-test tests/setup/run.sh

# On-demand expert fetch over loopback vs curl of the same ranges (tests/setup/bench.sh).
bench-setup: k3 k3-lab $(BUILD)/bench_fetch
	K3_BIN=./k3 K3_LAB_BIN=./k3-lab BENCH_FETCH=$(BUILD)/bench_fetch tests/setup/bench.sh

$(BUILD)/bench_fetch: tests/setup/bench_fetch.c $(BUILD)/libk3.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# The SIMD kernel tests for aarch64 (NEON): tests/test_simd.c + src/kernels, cross-compiled and
# run under qemu-aarch64; prints SKIPPED with the reason when the cross tools are missing.
NEON_CC  ?= aarch64-linux-gnu-gcc
NEON_SRC := $(wildcard src/kernels/*.c) src/util/err.c src/util/bf16lx.c tests/test_simd.c tests/test_main.c
test-neon:
	@if ! command -v $(NEON_CC) >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then \
	    echo "SKIPPED test-neon: $(NEON_CC) or qemu-aarch64 is missing" \
	         "(apt-get install gcc-aarch64-linux-gnu qemu-user)"; \
	else \
	    mkdir -p $(BUILD)/neon && \
	    $(NEON_CC) -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -ffp-contract=off \
	        -fno-fast-math -fopenmp '-DK3_TEST_SUITES=X(simd)' -o $(BUILD)/neon/k3_simd_tests \
	        $(NEON_SRC) -lm && \
	    qemu-aarch64 -L /usr/aarch64-linux-gnu $(BUILD)/neon/k3_simd_tests; \
	fi

# The AVX-512 kernels' logic on any x86-64 CPU: tests/test_simd.c with cpu_avx512.c built on
# SIMDe's portable AVX-512F (libsimde-dev, tests/simde_avx512.h); SKIPPED without it.
EMU_FLAGS := -O1 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -ffp-contract=off -fno-fast-math \
             -Wno-psabi -fopenmp -DK3_AVX512_EMULATED '-DK3_TEST_SUITES=X(simd)'
test-avx512-emu:
	@if [ "$$(uname -m)" != x86_64 ] || [ ! -f /usr/include/simde/x86/avx512.h ]; then \
	    echo "SKIPPED test-avx512-emu: needs x86-64 and libsimde-dev"; \
	else \
	    mkdir -p $(BUILD)/avx512emu && \
	    $(CC) $(EMU_FLAGS) -include tests/simde_avx512.h -c -o $(BUILD)/avx512emu/cpu_avx512.o \
	        src/kernels/cpu_avx512.c && \
	    $(CC) $(EMU_FLAGS) -o $(BUILD)/avx512emu/k3_simd_tests \
	        $(filter-out src/kernels/cpu_avx512.c,$(NEON_SRC)) $(BUILD)/avx512emu/cpu_avx512.o -lm && \
	    $(BUILD)/avx512emu/k3_simd_tests; \
	fi

# libFuzzer harnesses for k3's parsers (fuzz/README.md): clang with ASan + UBSan, in
# build-fuzz. `make fuzz` runs each FUZZ_SECONDS (default 60); `make fuzz-smoke` 20 s each
# (CI). A crash leaves its input in build-fuzz/crashes/: copy it to fuzz/regress/NAME/, where
# `make test` (tests/test_fuzzregress.c) replays it without libFuzzer.
FUZZ_CC     ?= clang
FUZZ_CFLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined \
               -fno-omit-frame-pointer
FUZZ_NAMES  := $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))
FUZZ_BINS   := $(FUZZ_NAMES:%=build-fuzz/fuzz_%)
FUZZ_SECONDS ?= 60
.PHONY: fuzz fuzz-smoke fuzz-build
fuzz-build:
	$(MAKE) BUILD=build-fuzz CC=$(FUZZ_CC) CFLAGS="$(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link" \
	    build-fuzz/libk3.a
	$(MAKE) $(FUZZ_BINS)

# clang has no `#pragma GCC target`: the two SIMD files get their ISA from flags (their code
# still runs only where the dispatcher finds the CPU feature). The kernels are no parser:
# built without sanitizers, which made them take minutes to compile.
FUZZ_KERNEL_FLAGS := -O1 -fno-sanitize=address,undefined -Wno-unknown-pragmas
build-fuzz/src/kernels/%.o: override CFLAGS += $(FUZZ_KERNEL_FLAGS)
build-fuzz/src/kernels/cpu_avx2.o: override CFLAGS += -mavx2 -mfma
build-fuzz/src/kernels/cpu_avx512.o: override CFLAGS += -mavx512f -mavx2 -mfma

build-fuzz/fuzz_%: fuzz/fuzz_%.c $(wildcard fuzz/*.h) build-fuzz/libk3.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror \
	    -fopenmp -DK3_FUZZ_LIBFUZZER -o $@ $< build-fuzz/libk3.a $(LDLIBS)

fuzz: fuzz-build
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh $(FUZZ_NAMES)

fuzz-smoke:
	@if ! command -v $(FUZZ_CC) >/dev/null 2>&1; then \
	    echo "SKIPPED fuzz-smoke: $(FUZZ_CC) is missing (apt-get install clang)"; \
	else \
	    $(MAKE) fuzz-build && FUZZ_SECONDS=20 fuzz/run.sh $(FUZZ_NAMES); \
	fi

deps:
	./scripts/install-deps.sh

# ---- installing ----------------------------------------------------------------------------
# `make install [PREFIX=/usr/local] [DESTDIR=...] [INSTALL_LAB=1]`: PREFIX/bin/k3 (k3-lab too
# with INSTALL_LAB=1), man pages made from the --help the option table prints
# (scripts/gen-man.sh: k3.1 and k3-COMMAND.1), and the bundled model in
# PREFIX/share/k3/k3-tiny-kjv, which an installed k3 finds from its own path with no MODEL_DIR
# (src/cli/model_dir.h). `make uninstall` with the same variables removes exactly that.
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
DATADIR     ?= $(PREFIX)/share
MANDIR      ?= $(DATADIR)/man
INSTALL     ?= install
INSTALL_LAB ?= 0
MODEL_FILES := $(wildcard tests/fixtures/k3-tiny-kjv/*.*)
.PHONY: man install uninstall test-install test-deb test-container

man: $(BUILD)/man/k3.1 $(if $(filter 1,$(INSTALL_LAB)),$(BUILD)/man-lab/k3-lab.1)

$(BUILD)/man/k3.1: $(BUILD)/k3 scripts/gen-man.sh
	sh scripts/gen-man.sh $(BUILD)/k3 $(BUILD)/man

$(BUILD)/man-lab/k3-lab.1: $(BUILD)/k3-lab scripts/gen-man.sh
	sh scripts/gen-man.sh $(BUILD)/k3-lab $(BUILD)/man-lab

install: $(BUILD)/k3 man $(if $(filter 1,$(INSTALL_LAB)),$(BUILD)/k3-lab)
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(DATADIR)/k3/k3-tiny-kjv
	$(INSTALL) -m 755 $(BUILD)/k3 $(DESTDIR)$(BINDIR)/k3
	$(if $(filter 1,$(INSTALL_LAB)),$(INSTALL) -m 755 $(BUILD)/k3-lab $(DESTDIR)$(BINDIR)/k3-lab)
	$(INSTALL) -m 644 $(BUILD)/man/*.1 $(DESTDIR)$(MANDIR)/man1/
	$(if $(filter 1,$(INSTALL_LAB)),$(INSTALL) -m 644 $(BUILD)/man-lab/*.1 $(DESTDIR)$(MANDIR)/man1/)
	$(INSTALL) -m 644 $(MODEL_FILES) $(DESTDIR)$(DATADIR)/k3/k3-tiny-kjv/

# k3-*.1 and not k3*.1: other programs' pages (k3b.1) share the prefix
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/k3 $(DESTDIR)$(BINDIR)/k3-lab $(DESTDIR)$(MANDIR)/man1/k3.1 \
	    $(DESTDIR)$(MANDIR)/man1/k3-*.1
	rm -rf $(DESTDIR)$(DATADIR)/k3

# `make install DESTDIR=tmp`, then the installed k3 run from outside the checkout with no
# MODEL_DIR: the bundled model's greedy ids against the fixture's reference, its text against
# the README's quick start, the man pages; then `make uninstall` leaves nothing (tests/install).
test-install: $(BUILD)/k3
	BUILD=$(BUILD) sh tests/install/run.sh

# The Debian package (debian/): built from a copy of the tree with dpkg-buildpackage, lintian
# clean of errors, installed with dpkg -i (as root), k3 --version and k3 run from it, purged.
# SKIPPED with the reason without dpkg-buildpackage/debhelper or root.
test-deb:
	sh tests/install/deb.sh

# The container file (Containerfile): built and run with podman or docker where one works,
# else checked by tests/install/container.sh (stages, runtime libraries against what k3
# links, entry point, volume) and SKIPPED for build/run with the reason.
test-container: $(BUILD)/k3
	BUILD=$(BUILD) sh tests/install/container.sh

clean:
	rm -rf build build-asan build-cuda build-mpi build-fuzz build-deb k3 k3-lab

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(LAB_OBJ:.o=.d) $(TEST_OBJ:.o=.d)
