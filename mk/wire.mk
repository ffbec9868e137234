# mk/wire.mk — rules for src/wire: protobuf-c code generated from src/wire/*.proto, and the
# official BLAKE3 C sources that Debian ships in librust-blake3-dev (compiled from their
# installed location, never copied into the tree) for the identity digests
# (docs/relay-contract.md §2.1).
#
# Included by the top Makefile after its variables are defined; it only appends to them.

# ---- protobuf-c --------------------------------------------------------------------------
# src/wire/X.proto -> $(BUILD)/gen/wire/X.pb-c.{c,h}; sources include "wire/X.pb-c.h"
# (the Makefile already passes -I$(BUILD)/gen). /usr/include provides protobuf-c.proto,
# which relay.proto imports for one protoc-c naming option.
WIRE_PROTOS := $(wildcard src/wire/*.proto)
WIRE_GEN_C  := $(patsubst src/%.proto,$(BUILD)/gen/%.pb-c.c,$(WIRE_PROTOS))
WIRE_GEN_H  := $(WIRE_GEN_C:.c=.h)
GEN_SRCS    += $(WIRE_GEN_C)

$(BUILD)/gen/wire/%.pb-c.c $(BUILD)/gen/wire/%.pb-c.h: src/wire/%.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --proto_path=src --proto_path=/usr/include --c_out=$(BUILD)/gen $<

# Generated sources are not under src/, so the generic $(BUILD)/%.o rule cannot map them.
$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	$(CC) $(CFLAGS) -c $< -o $@

# Everything that may include a generated header waits for it (parallel builds).
$(patsubst %.c,$(BUILD)/%.o,$(LIB_SRCS) $(UNIT_SRCS) $(MP_SRCS) $(BENCH_SRCS) $(KVBENCH_SRCS) $(PROG_SRCS)): | $(WIRE_GEN_H)

# ---- BLAKE3 (official C sources from librust-blake3-dev) ---------------------------------
BLAKE3_DIR := $(lastword $(sort $(wildcard /usr/share/cargo/registry/blake3-*/c)))
ifeq ($(BLAKE3_DIR),)
$(error BLAKE3's C sources are missing (librust-blake3-dev); run scripts/install-deps.sh)
endif
BLAKE3_C   := blake3.c blake3_dispatch.c blake3_portable.c
ifeq ($(shell uname -m),x86_64)
BLAKE3_S   := blake3_sse2_x86-64_unix.S blake3_sse41_x86-64_unix.S \
              blake3_avx2_x86-64_unix.S blake3_avx512_x86-64_unix.S
BLAKE3_DEFS :=
else
BLAKE3_S   :=
BLAKE3_DEFS := -DBLAKE3_NO_SSE2 -DBLAKE3_NO_SSE41 -DBLAKE3_NO_AVX2 -DBLAKE3_NO_AVX512
endif
BLAKE3_OBJS := $(patsubst %,$(BUILD)/blake3/%.o,$(basename $(BLAKE3_C) $(BLAKE3_S)))

# Third-party code: its own warning level, never -Werror.
$(BUILD)/blake3/%.o: $(BLAKE3_DIR)/%.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -g -O3 $(SAN) $(BLAKE3_DEFS) -c $< -o $@
$(BUILD)/blake3/%.o: $(BLAKE3_DIR)/%.S
	@mkdir -p $(dir $@)
	$(CC) $(SAN) -c $< -o $@

$(LIB): $(BLAKE3_OBJS)
$(BUILD)/src/wire/identity.o: EXTRA_CFLAGS += -I$(BLAKE3_DIR)

# The fuzz rule compiles sources directly: hand it the BLAKE3 sources and their header.
FUZZ_LIBS += -I$(BLAKE3_DIR) $(BLAKE3_DEFS) $(addprefix $(BLAKE3_DIR)/,$(BLAKE3_C) $(BLAKE3_S))
