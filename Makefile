# `make demo` runs the main job, `make test` the tests; each sets itself up on a fresh machine
# (Python >= 3.10, a C++ compiler and CMake are all it needs).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# A CPU build, pinned: an unpinned torch would pull gigabytes of CUDA packages.
TORCH_SPEC ?= torch==2.13.0
CSRC   := $(shell find dicomm/csrc dicomm/csrc_torch ditorch/csrc precision/csrc -name '*.cpp' -o -name '*.h' 2>/dev/null)
DIOPI_SRC := $(shell find diopi_bindings/reference diopi_bindings/include diopi_bindings/csrc diopi_bindings/csrc_diopi -name '*.cpp' -o -name '*.h' -o -name CMakeLists.txt 2>/dev/null)
STAMP  := $(VENV)/.installed

.PHONY: setup test test-slow test-cxx test-long test-rdma test-torch-suite test-diopi-full demo bench clean

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# flock: several `make` runs at once (parallel shells, CI retries) must not install concurrently.
$(STAMP): $(PY) pyproject.toml CMakeLists.txt $(CSRC) $(DIOPI_SRC)
	flock $(VENV)/.install.lock sh -c '\
	  $(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"; \
	  $(PY) -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12" && \
	  $(PY) -m pip install -q --no-build-isolation -e ".[test]"'
	touch $@

# The longest suites have their own target, test-long: the Soft-RoCE guest under QEMU (~6 min), the
# engine's tests under ThreadSanitizer (~3.5 min), heteropp's elastic fault and straggler re-plan runs and the
# elastic and fine-tuning walk-throughs run as written (HETEROPP_LONG_TESTS=1, ~9 min); `make test` keeps
# everything else.
LONG_TESTS := tests/rdma tests/cxx/test_sanitizers.py::test_progress_and_matching_tests_pass_under_tsan \
	tests/heteropp/test_example_elastic.py tests/heteropp/test_example_finetune.py \
	tests/heteropp/test_heteropp_elastic_faults.py \
	tests/heteropp/test_heteropp_straggler.py::test_a_throttled_host_is_replanned_around_when_the_gain_pays_for_the_restart \
	tests/heteropp/test_heteropp_elastic_snapshot.py::test_a_round_resumes_from_the_disk_when_both_copies_of_a_stage_are_gone \
	tests/heteropp/test_heteropp_replica_elastic.py::test_a_run_of_replica_groups_loses_a_host_and_goes_on_alone \
	tests/heteropp/test_heteropp_torchrun_rdzv.py::test_after_one_nodes_worker_fails_the_restarted_round_meets \
	tests/heteropp/test_heteropp_replica_straggler.py::test_a_slowed_stage_of_the_second_group_is_reported_and_an_even_run_is_not \
	tests/heteropp/test_heteropp_replica_straggler.py::test_a_throttled_host_of_a_replica_group_is_replanned_around

# The C++ slow gates, clang-tidy over the engine and the precision op hook (~3 min), the engine's tests
# under AddressSanitizer + UBSan (~1.7 min), the precision module's C++ op hook tests under the same
# sanitizers (~3.5 min with its build), the wire parsers' fuzz targets, a few seconds each under the same
# sanitizers (~1.5 min with their build), and the CPU-specific sources built for aarch64 (a cross compiler;
# seconds), have their own target, which CI runs after `make test` (.ci/run).
CXX_CHECKS := tests/cxx/test_clang_tidy.py tests/cxx/test_sanitizers.py::test_engine_tests_pass_under_asan_and_ubsan \
	tests/cxx/test_sanitizers.py::test_precision_cpp_hook_tests_pass_under_asan_and_ubsan tests/cxx/test_fuzz.py \
	tests/cxx/test_other_cpu_build.py

# The suite of `make test` and `make test-slow`: every test but the other targets' (the RDMA guest, the C++
# slow gates). The tests marked `slow` (pyproject.toml), whole runs of 15-95 s each (about 7 of the suite's
# 45 worker-minutes), run in `make test-slow`, which CI runs after `make test` (.ci/run).
SUITE := tests --ignore=tests/rdma --ignore=tests/cxx/test_clang_tidy.py --ignore=tests/cxx/test_fuzz.py \
	--ignore=tests/cxx/test_other_cpu_build.py \
	--deselect tests/cxx/test_sanitizers.py::test_progress_and_matching_tests_pass_under_tsan \
	--deselect tests/cxx/test_sanitizers.py::test_engine_tests_pass_under_asan_and_ubsan \
	--deselect tests/cxx/test_sanitizers.py::test_precision_cpp_hook_tests_pass_under_asan_and_ubsan

# `make test` runs in TEST_WORKERS pytest-xdist workers (tests that hold one resource of the machine take its
# lock: tests/conftest.py); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow" $(SUITE)

test-slow: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m slow $(SUITE)

test-cxx: setup
	$(PY) -m pytest -q $(CXX_CHECKS)

test-long: setup
	HETEROPP_LONG_TESTS=1 $(PY) -m pytest -q $(LONG_TESTS)

# The RDMA tests alone: a Soft-RoCE guest under QEMU (see docs/rdma.md; a few minutes).
test-rdma: setup
	$(PY) -m pytest -q tests/rdma

# PyTorch's own distributed suite, every test, on gloo and on dicomm (long; `make test` runs a
# quick selection of it).
test-torch-suite: setup
	DICOMM_TORCH_SUITE=full $(PY) -m pytest -q tests/torch_suite

# The DIOPI conformance suite with its large cases on the native device's memory (minutes; `make test`
# runs the quick selection).
test-diopi-full: setup
	DIOPI_CONFORMANCE=full $(PY) -m pytest -q tests/diopi_bindings -k conformance_suite_passes_on_native

demo: setup
	$(PY) -m heteropp.demo

bench: setup
	$(VENV)/bin/dicomm-bench p2p --json docs/bench-p2p.json
	$(VENV)/bin/dicomm-bench coll --json docs/bench-coll.json

clean:
	rm -rf build $(VENV)

# The wire-parser fuzz targets (tests/cxx/fuzz) under ASan + UBSan, FUZZ_SECONDS each (`make test-cxx`
# runs them for a few seconds): libFuzzer where the compiler is clang, a random-input driver otherwise.
FUZZ_SECONDS ?= 300
.PHONY: fuzz
fuzz: setup
	$(PY) -m tests.cxx.fuzz_build $(FUZZ_SECONDS)
