#!/usr/bin/env bash
# The whole-step CUDA graph benchmark in one run on a GPU host: ResNet-50 (imagenet
# stem, 32x32, channels_last, SGD with momentum) at batch 256, 512 and 1024 in fp16 (ltrain with a
# GradScaler) and bf16: ltrain graphed and eager, PyTorch Python eager, hand-captured graph and
# torch.compile(mode="reduce-overhead"), the matmul rates, and OUT/graph-table.md.
#
#   scripts/gpu/bench-graph.sh OUT [--ltrain build-gpu/ltrain] [--batch-sizes "256 512 1024"] [--steps 100]
# torch.compile takes about 45 s per configuration (H200, torch 2.11), so it runs last, in its own
# file: if the run is cut short, the other rows are already written.
set -euo pipefail
cd "$(dirname "$0")/../.."

out="${1:?usage: scripts/gpu/bench-graph.sh OUT [options]}"
shift
ltrain=build-gpu/ltrain batch_sizes="256 512 1024" steps=100
while (($#)); do
  case "$1" in
    --ltrain) ltrain="$2" ;;
    --batch-sizes) batch_sizes="$2" ;;
    --steps) steps="$2" ;;
    *) echo "bench-graph: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
mkdir -p "$out"

scripts/gpu/bench-step.sh "$out" --ltrain "$ltrain" --batch-sizes "$batch_sizes" --precision "fp16 bf16" \
  --channels-last on --graph "off on" --python-modes "eager graph" --steps "$steps" --warmup 15
python3 scripts/pytorch/bench_pytorch.py --skip-train --matmul --json "$out/matmul.json"
report() {
  python3 scripts/report/graph_report.py --ltrain "$out/ltrain-1.jsonl" \
    --pytorch "$out/pytorch-1.json" "$out/matmul.json" "$@" | tee "$out/graph-table.md"
}
report
# shellcheck disable=SC2086
python3 scripts/pytorch/bench_pytorch.py --arch resnet50 --stem imagenet --batch-sizes $batch_sizes \
  --precision fp16 bf16 --channels-last on --modes compile --steps "$steps" --warmup 15 \
  --json "$out/pytorch-compile.json"
report "$out/pytorch-compile.json"
