# mk/build.mk — the build proper, included by the top Makefile once scripts/install-deps.sh has
# run (see the comment there). Every $(shell ...) that asks about installed packages is expanded
# exactly once per make run (simple := assignments).

CC      ?= gcc
OPT     ?= -O2
BUILD   ?= build

# Debug assertions (src/base/dassert.h: lock-held and owner preconditions) are on in every
# build made to find bugs, DEBUG=1, ASAN=1 and UBSAN=1, and off in release. DEBUG=1 gets its own
# build directory like the sanitizers, so that asserting objects never mix with release ones.
DASSERT :=
ifeq ($(DEBUG),1)
OPT      = -O0
DASSERT  = -DKVR_DEBUG_ASSERTS
BUILD   := $(BUILD)-debug
endif

CFLAGS_BASE = -std=gnu11 -g $(OPT) -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
              -D_GNU_SOURCE -MMD -MP -fno-strict-aliasing -pthread -Isrc -I$(BUILD)/gen
# h2o_socket_read_start is defined in front of libh2o-evloop's own (io/http.c, the h2o body budget).
LDFLAGS_BASE = -pthread -Wl,--export-dynamic-symbol=h2o_socket_read_start

SAN :=
ifeq ($(ASAN),1)
SAN += -fsanitize=address -fno-omit-frame-pointer
DASSERT = -DKVR_DEBUG_ASSERTS
BUILD := $(BUILD)-asan
endif
ifeq ($(UBSAN),1)
SAN += -fsanitize=undefined -fno-sanitize-recover=undefined
DASSERT = -DKVR_DEBUG_ASSERTS
BUILD := $(BUILD)-ubsan
endif

# Every library the tree links against comes from a Debian package (scripts/install-deps.sh).
# pkg-config runs once per make run; a missing package stops the build here, not in a compile.
PKGS := libxxhash libh2o-evloop libssl libcrypto liburing libnghttp2 libprotobuf-c libzmq msgpack
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   := $(shell pkg-config --libs $(PKGS))
ifeq ($(PKG_LIBS),)
$(error pkg-config found none of: $(PKGS); run scripts/install-deps.sh)
endif
LIBS    = $(PKG_LIBS) -lm
# h2o's pkg-config file does not set H2O_USE_LIBUV=0; http.c defines it itself.
CFLAGS  = $(CFLAGS_BASE) $(DASSERT) $(SAN) $(PKG_CFLAGS) $(EXTRA_CFLAGS)
LDFLAGS = $(LDFLAGS_BASE) $(SAN)

# The library: every module under src/ except the program entry points in src/main/.
LIB_SRCS := $(wildcard src/base/*.c src/shm/*.c src/wire/*.c src/core/*.c src/io/*.c src/proc/*.c)
GEN_SRCS :=
LIB_OBJS  = $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRCS)) $(patsubst %.c,%.o,$(GEN_SRCS))
LIB       = $(BUILD)/libkvrelay.a

PROG_SRCS := $(wildcard src/main/*.c)
PROGS      = $(patsubst src/main/%.c,$(BUILD)/%,$(PROG_SRCS))

UNIT_SRCS := $(wildcard tests/unit/*.c)
UNIT_BIN   = $(BUILD)/test-unit
MP_SRCS   := $(wildcard tests/mp/*.c)
MP_BIN     = $(BUILD)/test-mp
BENCH_SRCS := $(wildcard bench/*.c)
BENCHES    = $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
# The load generator users run against a live server (issue 6): tools/kvrelay-bench/*.c.
KVBENCH_SRCS := $(wildcard tools/kvrelay-bench/*.c)
KVBENCH      = $(if $(KVBENCH_SRCS),$(BUILD)/kvrelay-bench)
# The null server (bench/null_server.c, issue 10) is a tool of scripts/bench-dataplane.sh and of
# the e2e tests, not a benchmark that prints figures: `all` builds it, `make bench` does not run it.
NULLSRV      = $(if $(wildcard bench/null_server.c),$(BUILD)/bench/null_server)
# The second load client (bench/lean/*.c, issue 25), written apart from kvrelay-bench and
# linked with nothing of the tree: likewise a tool of scripts/bench-dataplane.sh (--client lean)
# and of the e2e tests, built by `all` as $(BUILD)/bench/lean_client.
LEANCLI_SRCS := $(wildcard bench/lean/*.c)
LEANCLI      = $(if $(LEANCLI_SRCS),$(BUILD)/bench/lean_client)

.DEFAULT_GOAL := all

# Module-specific rules (generated code, sources compiled from Debian packages).
include mk/wire.mk

# Keep program objects (they would otherwise count as intermediate files).
.SECONDARY:

.PHONY: all run test test-unit test-mp test-e2e check-layers bench fuzz fuzz-run format check-format clean

all: $(LIB) $(PROGS) $(KVBENCH) $(NULLSRV) $(LEANCLI)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# --version: the release and the git commit, in $(BUILD)/gen/version.h, rewritten only when
# they change. Outside a git checkout (a container build) pass KVR_GIT_COMMIT=... or get "unknown".
KVR_VERSION    ?= 0.1.0
KVR_GIT_COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
$(BUILD)/gen/version.h: kvr-version-check
	@mkdir -p $(dir $@)
	@printf '#define KVR_VERSION "%s"\n#define KVR_GIT_COMMIT "%s"\n' '$(KVR_VERSION)' '$(KVR_GIT_COMMIT)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
.PHONY: kvr-version-check
$(BUILD)/src/main/kvrelay-supervisor.o: $(BUILD)/gen/version.h

$(BUILD)/%: $(BUILD)/src/main/%.o $(LIB)
	$(CC) $(LDFLAGS) $< $(LIB) $(LIBS) $(PROG_LIBS) -o $@

$(BUILD)/kvrelay-bench: $(patsubst %.c,$(BUILD)/%.o,$(KVBENCH_SRCS)) $(LIB)
	$(CC) $(LDFLAGS) $(filter %.o,$^) $(LIB) $(LIBS) -o $@

$(UNIT_BIN): $(patsubst %.c,$(BUILD)/%.o,$(UNIT_SRCS)) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(filter %.o,$^) $(LIB) $(LIBS) -lcriterion -o $@

$(MP_BIN): $(patsubst %.c,$(BUILD)/%.o,$(MP_SRCS)) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(filter %.o,$^) $(LIB) $(LIBS) -lcriterion -o $@

$(BUILD)/bench/lean_client: $(patsubst %.c,$(BUILD)/%.o,$(LEANCLI_SRCS))
	$(CC) $(LDFLAGS) $^ -o $@

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB)
	$(CC) $(LDFLAGS) $< $(LIB) $(LIBS) -o $@

# Criterion prints "[====] Synthesis: Tested: N | Passing: N | Failing: 0 | Crashing: 0".
# Criterion's runner leaks one allocation of its own; nothing of ours is suppressed.
TEST_ENV = LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1

# Each layer is a target of its own and fails when one of its tests fails; `test` runs them in
# order (one after the other even under -j: they share the machine's two cores).
test-unit: all $(UNIT_BIN)
	$(TEST_ENV) $(UNIT_BIN) --jobs=2
test-mp: all $(MP_BIN)
	$(TEST_ENV) $(MP_BIN) --jobs=1
test-e2e: all
	KVRELAY_BUILD=$(BUILD) /usr/bin/python3 -m pytest -q tests/e2e
# The include graph of src/ runs down its layers, and no module circle is left anywhere: not
# inside src/'s layers, not in tools/ and bench/ (scripts/check-layers.py), and the checker
# refuses deliberately bad includes and planted circles (scripts/test-check-layers.sh).
check-layers:
	@scripts/check-layers.py src && echo "check-layers: src/ ok"
	@scripts/check-layers.py --circles tools bench && echo "check-layers: tools/ bench/ ok, no circle"
	@scripts/check-layers.py --circles src && echo "check-layers: src/ no module circle"
	@scripts/check-size.py src tools bench && echo "check-size: no file over 800 lines, no function over 120 without its reason"
	@scripts/test-check-layers.sh src
# tests/e2e/test_bench_ssd_scan.py runs the scan benchmark small: build it with the tests.
test: all $(UNIT_BIN) $(MP_BIN) $(BUILD)/bench/bench_ssd_scan
	@$(MAKE) --no-print-directory check-format
	@$(MAKE) --no-print-directory check-layers
	@$(MAKE) --no-print-directory test-unit
	@$(MAKE) --no-print-directory test-mp
	@$(MAKE) --no-print-directory test-e2e

bench: all $(BENCHES)
	@for b in $(filter-out $(NULLSRV),$(BENCHES)); do $$b || exit 1; done

FUZZ_SRCS := $(wildcard tests/fuzz/*.c)
FUZZERS    = $(patsubst tests/fuzz/%.c,build-fuzz/%,$(FUZZ_SRCS))
FUZZ_SECONDS ?= 60
fuzz: $(FUZZERS)
build-fuzz/%: tests/fuzz/%.c $(LIB_SRCS) $(GEN_SRCS)
	@mkdir -p build-fuzz
	clang -std=gnu11 -g -O1 -D_GNU_SOURCE -Isrc -I$(BUILD)/gen -fsanitize=fuzzer,address,undefined \
	    $< $(LIB_SRCS) $(GEN_SRCS) $(LIBS) $(FUZZ_LIBS) -Wl,--export-dynamic-symbol=h2o_socket_read_start -o $@
fuzz-run: fuzz
	@for f in $(FUZZERS); do n=$$(basename $$f); mkdir -p build-fuzz/corpus-$$n; \
	    $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 build-fuzz/corpus-$$n tests/fuzz/corpus/$$n \
	    || exit 1; done

run: all
	@if [ -x $(BUILD)/kvrelay-supervisor ]; then exec $(BUILD)/kvrelay-supervisor $(RUN_ARGS); \
	else echo "kvrelay-supervisor is not built yet (the server issue adds it); the storage engine is in $(LIB)"; fi

# .clang-format describes the tree's style (clang-format 14). `format` rewrites every C file to
# it; `check-format` rewrites nothing, lists the files that differ and fails if there is any.
FORMAT_SRCS = $(shell find src tools bench tests -name '*.[ch]' | sort)
format:
	clang-format --style=file -i $(FORMAT_SRCS)
check-format:
	@clang-format --style=file --dump-config >/dev/null || { echo "check-format: .clang-format is not valid"; exit 1; }
	@bad=""; for f in $(FORMAT_SRCS); do \
	    clang-format --style=file --dry-run -Werror "$$f" >/dev/null 2>&1 || bad="$$bad $$f"; \
	done; \
	if [ -n "$$bad" ]; then \
	    for f in $$bad; do echo "check-format: $$f differs from .clang-format"; done; \
	    echo "check-format: $$(echo $$bad | wc -w) file(s) differ; make format rewrites them"; exit 1; \
	fi; \
	echo "check-format: $(words $(FORMAT_SRCS)) files ok"

clean:
	rm -rf build build-debug build-asan build-ubsan build-asan-ubsan build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
