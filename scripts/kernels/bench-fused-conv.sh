#!/usr/bin/env bash
# Builds and runs scripts/kernels/bench_fused_conv.cu: ltrain's CUTLASS convolution with BatchNorm
# statistics (src/kernels/fused_conv/) against cuDNN's plain convolution, each followed by ltrain's
# BatchNorm (src/kernels/batch_norm*.cu), for sm_90a. cuDNN: the one torch loads (the nvidia-cudnn
# wheel beside it), else the CUDA toolkit's. CUTLASS: the headers of
# the nvidia-cutlass wheel in the project's .venv (scripts/requirements-fused-conv.txt says how), or
# CUTLASS_INCLUDE=<folder holding cutlass/ and cute/> with CUTLASS_UTIL_INCLUDE=<tools/util/include>.
# FUSED_CONV_BINARY names the binary (default $TMPDIR/bench-fused-conv); FUSED_CONV_BUILD=0 runs it
# without building (a binary built elsewhere), FUSED_CONV_RUN=0 builds without running (on a host
# without the GPU). Arguments go to the benchmark.
set -euo pipefail
cd "$(dirname "$0")/../.."
binary=${FUSED_CONV_BINARY:-${TMPDIR:-/tmp}/bench-fused-conv}
python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python
cudnn=$($python -c 'import nvidia.cudnn, os; print(list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
if [[ ${FUSED_CONV_BUILD:-1} != 0 ]]; then
  if [[ -z ${CUTLASS_INCLUDE:-} ]]; then
    source_dir=$($python -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')
    CUTLASS_INCLUDE=$source_dir/include
    CUTLASS_UTIL_INCLUDE=$source_dir/tools/util/include
  fi
  cudnn_flags=(-lcudnn)
  if [[ -n "$cudnn" && -f "$cudnn/include/cudnn.h" ]]; then
    cudnn_flags=(-I"$cudnn/include" -L"$cudnn/lib" -l:libcudnn.so.9 -Xlinker -rpath="$cudnn/lib")
  fi
  objects=$(mktemp -d)
  trap 'rm -rf "$objects"' EXIT
  flags=(-std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude
         -isystem "$CUTLASS_INCLUDE" -isystem "${CUTLASS_UTIL_INCLUDE:-$CUTLASS_INCLUDE}" -Xcompiler=-Wall,-Wextra)
  # One object a process, side by side: a CUTLASS instance takes minutes and about 3.5 GiB, so as
  # many at once as the free memory holds at 4 GiB each (FUSED_CONV_JOBS sets the number).
  jobs_at_once=${FUSED_CONV_JOBS:-$(awk '/^MemAvailable:/ { print int($2 / 4194304) }' /proc/meminfo)}
  (( jobs_at_once >= 1 )) || jobs_at_once=1
  pids=()
  compile() {  # source object [flags]: in the background, after the oldest where jobs_at_once run
    if (( ${#pids[@]} >= jobs_at_once )); then
      wait "${pids[0]}"
      pids=("${pids[@]:1}")
    fi
    nvcc "${flags[@]}" "${@:3}" -c "$1" -o "$2" & pids+=($!)
  }
  # The BatchNorm kernels and the device checks they decide from. device_fit.cpp and src/device/ are
  # plain C++: told the one architecture built here, as CMake's LTRAIN_CUDA_ARCHITECTURES tells it,
  # and with fmt header-only so that the binary needs no libfmt where it runs.
  for source in src/kernels/batch_norm.cu src/kernels/batch_norm_kernels.cu src/kernels/device_limits.cu \
                src/kernels/device_fit.cpp src/device/architectures.cpp src/device/gpu_profile.cpp; do
    name=$(basename "$source")
    compile "$source" "$objects/${name%.*}.o" '-DLTRAIN_CUDA_ARCHITECTURES="90a-real"' -DFMT_HEADER_ONLY
  done
  for source in src/kernels/fused_conv/instances/*.cu; do
    compile "$source" "$objects/$(basename "$source" .cu).o"
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  nvcc "${flags[@]}" -o "$binary" scripts/kernels/bench_fused_conv.cu src/kernels/fused_conv/fused_conv.cu \
    experiments/conv_graph/conv_graph.cpp "$objects"/*.o "${cudnn_flags[@]}"
fi
if [[ -n "$cudnn" && -d "$cudnn/lib" ]]; then export LD_LIBRARY_PATH="$cudnn/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [[ ${FUSED_CONV_RUN:-1} != 0 ]]; then "$binary" "$@"; fi
