# kvrelay — the control panel.
#
#   make            install the missing build packages, build everything into build/
#   make run        the same, then start the server on its defaults (RUN_ARGS="..." adds flags)
#   make test       also the test packages; build and run every test: check-format, check-layers, test-unit,
#                   test-mp, test-e2e (each also on its own; check-layers: src/ runs down its
#                   layers, tools/ and bench/ have no include circle)
#   make bench      also the benchmark packages; build and run the micro-benchmarks, each line
#                   "name value unit" (the data-plane comparison: scripts/bench-dataplane.sh)
#   make fuzz       build the libFuzzer drivers (clang); make fuzz-run FUZZ_SECONDS=N runs them
#   make format     clang-format the tree (.clang-format); make check-format lists the files that
#                   differ from it and fails if there is any
#
# Switches: ASAN=1 UBSAN=1 DEBUG=1 (each selects its own build directory), CC=..., OPT=...
#
# Two passes. This outer pass runs scripts/install-deps.sh and then calls make again with
# KVR_DEPS=1 for the real work (mk/build.mk): anything that asks the system about installed
# packages (pkg-config, the BLAKE3 source directory) is evaluated only after the install step.
# The goals pick the package sets: `make` and `make run` install the build set only; the test
# goals (and fuzz) add the test set, `make bench` the bench set, format and check-format
# clang-format. `make clean` installs nothing.

ifneq ($(KVR_DEPS),1)

GOALS := $(or $(MAKECMDGOALS),all)
NODEPS_GOALS := clean
TEST_GOALS := test test-unit test-mp test-e2e check-layers fuzz fuzz-run
DEPS_SETS := build $(if $(filter $(TEST_GOALS),$(GOALS)),test) $(if $(filter bench,$(GOALS)),bench) \
             $(if $(filter format check-format,$(GOALS)),format)

.PHONY: $(GOALS) deps
$(filter-out $(NODEPS_GOALS),$(GOALS)): deps
	@$(MAKE) --no-print-directory KVR_DEPS=1 $@
$(filter $(NODEPS_GOALS),$(GOALS)):
	@$(MAKE) --no-print-directory KVR_DEPS=1 $@
deps:
	@scripts/install-deps.sh $(DEPS_SETS)

else
include mk/build.mk
endif
