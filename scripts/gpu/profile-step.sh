#!/usr/bin/env bash
# Where the time of one training step goes, ltrain beside PyTorch Python, on a GPU host: both
# profile a few steps after their timed ones (LibTorch's / torch.profiler's Chrome traces), and
# scripts/report/trace_summary.py prints host operators, CUDA runtime calls and kernels per step.
#
#   scripts/gpu/profile-step.sh OUT [--ltrain build-gpu/ltrain] [--config configs/bench/resnet50-step.json]
#                               [--batch 256] [--precision fp16] [--channels-last on] [--python-mode eager]
#                               [--graph off]
# --graph on profiles ltrain's whole-step CUDA graph (cuda_graph.train) and, unless --python-mode
# says otherwise, PyTorch's hand-captured graph.
set -euo pipefail
cd "$(dirname "$0")/../.."

out="${1:?usage: scripts/gpu/profile-step.sh OUT [options]}"
shift
ltrain=build-gpu/ltrain config=configs/bench/resnet50-step.json batch=256 precision=fp16 channels_last=on
python_mode=""  graph=off
while (($#)); do
  case "$1" in
    --ltrain) ltrain="$2" ;;
    --config) config="$2" ;;
    --batch) batch="$2" ;;
    --precision) precision="$2" ;;
    --channels-last) channels_last="$2" ;;
    --python-mode) python_mode="$2" ;;
    --graph) graph="$2" ;;
    *) echo "profile-step: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
mkdir -p "$out"
[ -n "$python_mode" ] || python_mode=$([ "$graph" = on ] && echo graph || echo eager)
name="$precision-$([ "$channels_last" = on ] && echo cl || echo nchw)-b$batch$([ "$graph" = on ] && echo -graph || true)"

"$ltrain" bench step --config "$config" --set "data.batch_size=$batch" --set "precision.mode=$precision" \
  --set "model.channels_last=$([ "$channels_last" = on ] && echo true || echo false)" \
  --set "cuda_graph.train=$([ "$graph" = on ] && echo true || echo false)" \
  --warmup 15 --steps 30 --json --profile "$out/ltrain-$name.json" | tee "$out/ltrain-$name.result.json"
echo "== ltrain $name"
python3 scripts/report/trace_summary.py "$out/ltrain-$name.json" --steps 5

arch=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['arch'])" "$out/ltrain-$name.result.json")
stem=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['stem'])" "$out/ltrain-$name.result.json")
python3 scripts/pytorch/bench_pytorch.py --arch "$arch" --stem "$stem" --batch-sizes "$batch" --precision "$precision" \
  --channels-last "$channels_last" --modes "$python_mode" --warmup 15 --steps 30 \
  --json "$out/pytorch-$name.result.json" --profile-dir "$out" >/dev/null
echo "== PyTorch $python_mode $name"
layout=$([ "$channels_last" = on ] && echo cl || echo nchw)
python3 scripts/report/trace_summary.py \
  "$out/pytorch-$arch-$stem-$python_mode-$precision-$layout-seg0-b$batch.json" --steps 5
