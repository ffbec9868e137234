# kvrelay — the control panel.
#
#   make            install missing Debian packages, build everything into build/
#   make run        the same, then start the server on its defaults (RUN_ARGS="..." adds flags)
#   make test       build and run every test: check-layers, test-unit, test-mp, test-e2e (each also
#                   on its own; check-layers: the include graph of src/ has no cycles)
#   make bench      build and run the benchmarks; each line is "name value unit"
#   make fuzz       build the libFuzzer drivers (clang); make fuzz-run FUZZ_SECONDS=N runs them
#   make format     clang-format the tree
#
# Switches: ASAN=1 UBSAN=1 DEBUG=1 (each selects its own build directory), CC=..., OPT=...
#
# Two passes. This outer pass runs scripts/install-deps.sh and then calls make again with
# KVR_DEPS=1 for the real work (mk/build.mk): anything that asks the system about installed
# packages (pkg-config, the BLAKE3 source directory) is evaluated only after the install step.

ifneq ($(KVR_DEPS),1)

GOALS := $(or $(MAKECMDGOALS),all)
NODEPS_GOALS := clean format

.PHONY: $(GOALS) deps
$(filter-out $(NODEPS_GOALS),$(GOALS)): deps
	@$(MAKE) --no-print-directory KVR_DEPS=1 $@
$(filter $(NODEPS_GOALS),$(GOALS)):
	@$(MAKE) --no-print-directory KVR_DEPS=1 $@
deps:
	@scripts/install-deps.sh

else
include mk/build.mk
endif
