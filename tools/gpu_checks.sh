#!/usr/bin/env bash
# The checks that need a CUDA device, in one run: the package built in place against the torch present (a
# CUDA build), then the CUDA tests (dicomm's device-memory staging and dma-buf export, CUDA tensors over
# dicomm, a pipeline mixing CUDA and CPU stages, ditorch on a CUDA host) and the CUDA-against-CPU precision
# compare of one HuggingFace model. Every test elsewhere skips these. Usage, from the repository root:
#   tools/gpu_checks.sh OUTDIR          (PYTHON=... picks the interpreter; python3 by default)
# OUTDIR receives the build log, pytest's log and junit XML, the compare's text, CSV and HTML reports, and
# summary.txt, one line a phase with its exit status and wall time. Exit status: the first phase's that failed.
set -uo pipefail
out=$(mkdir -p "${1:?usage: tools/gpu_checks.sh OUTDIR}" && cd "$1" && pwd)
PY=${PYTHON:-python3}
work=$(mktemp -d)
status=0
phase() {  # phase NAME CMD...: runs CMD, logs it under OUTDIR/NAME.log, records the status and time
  local name=$1 t0=$SECONDS rc
  shift
  "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc, $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  if [ "$rc" != 0 ]; then tail -40 "$out/$name.log"; [ "$status" = 0 ] && status=$rc; fi
  return "$rc"
}

"$PY" - <<'EOF' | tee "$out/summary.txt" || exit 2
import torch
assert torch.cuda.is_available(), "no CUDA device: these checks need one"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
EOF

# The system's compiler, whose libstdc++ torch runs with: an image's own toolchain in CC/CXX can link a second
# C++ runtime into the modules (one such build crashed in its first stream output). GPU_CHECKS_CXX overrides.
export CC=${GPU_CHECKS_CC:-gcc} CXX=${GPU_CHECKS_CXX:-g++}
"$CXX" --version | head -1 | tee -a "$out/summary.txt"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
# torch's own CMake config needs CUDA's whole toolkit for a CUDA build; this package's modules do not.
phase build "$PY" -m pip install --no-build-isolation --no-deps --no-index -e . \
  --config-settings=cmake.define.DICOMM_TORCH_CMAKE_CONFIG=OFF || exit "$status"

# GPU_TESTS: the test paths to run (default: every test with a CUDA part)
# shellcheck disable=SC2086
phase cuda_tests "$PY" -m pytest -q -rA -p no:cacheprovider --junitxml="$out/cuda_tests.xml" \
  ${GPU_TESTS:-tests/dicomm/test_accel_device_memory.py tests/dicomm/test_backend_staging.py \
  tests/dicomm/test_backend_clients.py tests/dicomm/test_backend_splitting.py \
  tests/heteropp/test_heteropp_mixed_device.py tests/ditorch}

# The same seeded model, data and AdamW steps on CUDA and on the CPU; the compare replays both runs' ops in
# float64 on the CPU (docs/precision.md, "The GPU-against-CPU compare"). Its exit 1 is its answer "a
# divergence", recorded with the report, not a failure of this script.
steps=${GPU_COMPARE_STEPS:-2}
compare() {  # compare ATTN: capture on both devices, then compare
  local attn=$1 t0=$SECONDS
  phase "capture_cuda_$attn" "$PY" -m ditorch_precision.examples.gpu_vs_cpu cuda "$work/cuda-$attn" \
    --steps "$steps" --attn "$attn" || return
  phase "capture_cpu_$attn" "$PY" -m ditorch_precision.examples.gpu_vs_cpu cpu "$work/cpu-$attn" \
    --steps "$steps" --attn "$attn" || return
  t0=$SECONDS
  "$PY" -m ditorch_precision compare "$work/cuda-$attn" "$work/cpu-$attn" --html "$out/compare_$attn.html" \
    --csv "$out/compare_$attn.csv" > "$out/compare_$attn.txt" 2>&1
  echo "compare_$attn: exit $?, $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  rm -rf "$work/cuda-$attn" "$work/cpu-$attn"
}
# GPU_COMPARE_ATTN: the attention implementations to compare ("eager": matmul and softmax; "sdpa": CUDA's
# fused attention kernels against the CPU's); empty: none
for attn in ${GPU_COMPARE_ATTN-eager sdpa}; do compare "$attn"; done
rm -rf "$work"
exit "$status"
