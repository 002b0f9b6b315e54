#!/usr/bin/env bash
# Builds and runs experiments/conv_graph/bench_conv_graph.cu against the cuDNN that torch loads (the
# nvidia-cudnn wheel beside it), else the CUDA toolkit's. Arguments go to the benchmark.
set -euo pipefail
cd "$(dirname "$0")/../.."
cudnn=$(python3 -c 'import nvidia.cudnn, os; print(list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
flags=(-lcudnn)
if [[ -n "$cudnn" && -f "$cudnn/include/cudnn.h" ]]; then
  flags=(-I"$cudnn/include" -L"$cudnn/lib" -l:libcudnn.so.9 -Xlinker -rpath="$cudnn/lib")
fi
binary=${TMPDIR:-/tmp}/bench-conv-graph
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
nvcc -std=c++17 -O2 -arch="sm_${arch:-90}" -Iinclude -o "$binary" experiments/conv_graph/bench_conv_graph.cu \
  experiments/conv_graph/conv_graph.cpp "${flags[@]}"
"$binary" "$@"
