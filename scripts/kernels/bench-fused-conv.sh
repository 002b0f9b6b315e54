#!/usr/bin/env bash
# Builds and runs scripts/kernels/bench_fused_conv.cu: ltrain's CUTLASS convolution with BatchNorm
# statistics (src/kernels/fused_conv/) against cuDNN's plain convolution, for sm_90a. cuDNN: the one
# torch loads (the nvidia-cudnn wheel beside it), else the CUDA toolkit's. CUTLASS: the headers of
# the nvidia-cutlass wheel 4.2.0.0 in the project's .venv (pip install --no-deps nvidia-cutlass==4.2.0.0), or
# CUTLASS_INCLUDE=<folder holding cutlass/ and cute/> with CUTLASS_UTIL_INCLUDE=<tools/util/include>.
# FUSED_CONV_BINARY names the binary (default $TMPDIR/bench-fused-conv); FUSED_CONV_BUILD=0 runs it
# without building (a binary built elsewhere). Arguments go to the benchmark.
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
  # One CUTLASS instance a process: minutes each, so they build side by side.
  pids=()
  for source in src/kernels/fused_conv/instances/*.cu; do
    nvcc "${flags[@]}" -c "$source" -o "$objects/$(basename "$source" .cu).o" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  nvcc "${flags[@]}" -o "$binary" scripts/kernels/bench_fused_conv.cu src/kernels/fused_conv/fused_conv.cu \
    src/kernels/conv_graph.cpp "$objects"/*.o "${cudnn_flags[@]}"
fi
if [[ -n "$cudnn" && -d "$cudnn/lib" ]]; then export LD_LIBRARY_PATH="$cudnn/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [[ ${FUSED_CONV_RUN:-1} != 0 ]]; then "$binary" "$@"; fi
