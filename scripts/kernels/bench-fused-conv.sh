#!/usr/bin/env bash
# Builds and runs ltrain_bench_fused_conv (scripts/kernels/bench_fused_conv.cu, a target of
# cmake/kernel_benchmarks.cmake): ltrain's CUTLASS convolution with BatchNorm statistics
# (src/kernels/fused_conv/, sm_90a) against cuDNN's plain convolution, each followed by ltrain's
# BatchNorm (src/kernels/batch_norm*.cu). It builds in FUSED_CONV_BUILD_DIR (default build/, a CUDA
# build that scripts/setup.sh configured, with cuDNN), turning -DLTRAIN_FUSED_CONV=ON there; CUTLASS's
# headers come from the nvidia-cutlass wheel in the project's .venv (scripts/requirements-fused-conv.txt
# says how), or LTRAIN_CUTLASS_DIR given to CMake. FUSED_CONV_BINARY names the binary (default
# BUILD/ltrain_bench_fused_conv); FUSED_CONV_BUILD=0 runs it without building (a binary built
# elsewhere), FUSED_CONV_RUN=0 builds without running (on a host without the GPU). Arguments go to
# the benchmark.
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${FUSED_CONV_BUILD_DIR:-build}
binary=${FUSED_CONV_BINARY:-$build_dir/ltrain_bench_fused_conv}
if [[ ${FUSED_CONV_BUILD:-1} != 0 ]]; then
  if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
    echo "bench-fused-conv: $build_dir/ is no configured build: run bash scripts/setup.sh (a CUDA build) first," \
         "or name one with FUSED_CONV_BUILD_DIR" >&2
    exit 2
  fi
  cmake -S . -B "$build_dir" -DLTRAIN_FUSED_CONV=ON >/dev/null
  # A CUTLASS instance takes minutes and about 3.5 GiB to compile: as many at once as the free
  # memory holds at 4 GiB each (FUSED_CONV_JOBS sets the number).
  jobs_at_once=${FUSED_CONV_JOBS:-$(awk '/^MemAvailable:/ { print int($2 / 4194304) }' /proc/meminfo)}
  (( jobs_at_once >= 1 )) || jobs_at_once=1
  # Standard output is the benchmark's alone (scripts/report/step_model.py reads it).
  cmake --build "$build_dir" --target ltrain_bench_fused_conv --parallel "$jobs_at_once" >&2
fi
if [[ ${FUSED_CONV_RUN:-1} != 0 ]]; then "$binary" "$@"; fi
