#!/usr/bin/env bash
# Training-step throughput of ltrain and of PyTorch Python (scripts/pytorch/bench_pytorch.py) on
# the same GPU in one run, written side by side: OUT/ltrain-R.jsonl, OUT/pytorch-R.json per round R, and
# OUT/step-table.md (medians over the rounds, and the range of the per-round ratios).
#
#   scripts/gpu/bench-step.sh OUT [--ltrain build-gpu/ltrain] [--config configs/bench/resnet50-step.json]
#                             [--batch-sizes "256 512"] [--precision "fp32"] [--channels-last "off"]
#                             [--segments "0"] [--graph "off"] [--steps 50] [--warmup 15] [--python-modes eager]
#                             [--rounds 1] [--image-size 32] [--python-sgd foreach] [--set KEY=VALUE]...
# --segments lists model.checkpoint_segments values (0: activation checkpointing off); --graph
# lists cuda_graph.train values for ltrain ("off on": eager and graphed rows); --python-modes
# lists bench_pytorch.py modes (eager compile graph); --python-sgd picks torch.optim.SGD's kernels
# there (foreach, its default, or fused).
# --set adds a config override to every ltrain run (repeatable), e.g. --set model.cudnn_batch_norm=false.
# --image-size N sets the side of the square images on both sides (ltrain's data.image_size,
# bench_pytorch.py --image-size); without it ltrain takes the config's and PyTorch 32 px.
# --rounds N runs the whole grid N times, ltrain then Python in each round: the host's speed
# drifts within a run (seen on the H200 host), and alternating keeps both sides under the same drift.
set -euo pipefail
cd "$(dirname "$0")/../.."

out="${1:?usage: scripts/gpu/bench-step.sh OUT [options]}"
shift
ltrain=build-gpu/ltrain config=configs/bench/resnet50-step.json
batch_sizes="256 512" precisions="fp32" channels_last="off" segments="0" graph=off steps=50 warmup=15 python_modes=eager rounds=1
python_sgd=foreach
extra_sets=() python_size=()
while (($#)); do
  case "$1" in
    --ltrain) ltrain="$2" ;;
    --config) config="$2" ;;
    --batch-sizes) batch_sizes="$2" ;;
    --precision) precisions="$2" ;;
    --channels-last) channels_last="$2" ;;
    --segments) segments="$2" ;;
    --graph) graph="$2" ;;
    --python-modes) python_modes="$2" ;;
    --python-sgd) python_sgd="$2" ;;
    --steps) steps="$2" ;;
    --warmup) warmup="$2" ;;
    --rounds) rounds="$2" ;;
    --set) extra_sets+=(--set "$2") ;;
    --image-size) extra_sets+=(--set "data.image_size=$2") python_size=(--image-size "$2") ;;
    *) echo "bench-step: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
mkdir -p "$out"
# bench_pytorch.py takes on, off or both.
case "$channels_last" in "off") python_layout=off ;; "on") python_layout=on ;; *) python_layout=both ;; esac

run_ltrain_grid() {  # $1: output file
  : >"$1"
  for layout in $channels_last; do
    for precision in $precisions; do
      for segment_count in $segments; do
        for graphed in $graph; do
          for batch in $batch_sizes; do
            "$ltrain" bench step --config "$config" --set "data.batch_size=$batch" --set "precision.mode=$precision" \
              --set "model.channels_last=$([ "$layout" = on ] && echo true || echo false)" \
              --set "model.checkpoint_segments=$segment_count" \
              --set "cuda_graph.train=$([ "$graphed" = on ] && echo true || echo false)" \
              "${extra_sets[@]}" --warmup "$warmup" --steps "$steps" --json | tee -a "$1"
          done
        done
      done
    done
  done
}

ltrain_files=() pytorch_files=()
for round in $(seq 1 "$rounds"); do
  run_ltrain_grid "$out/ltrain-$round.jsonl"
  arch=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['arch'])" "$out/ltrain-$round.jsonl")
  stem=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['stem'])" "$out/ltrain-$round.jsonl")
  # shellcheck disable=SC2086
  python3 scripts/pytorch/bench_pytorch.py --arch "$arch" --stem "$stem" --batch-sizes $batch_sizes \
    --precision $precisions --channels-last "$python_layout" --checkpoint-segments $segments \
    --modes $python_modes --sgd "$python_sgd" "${python_size[@]}" --steps "$steps" --warmup "$warmup" \
    --json "$out/pytorch-$round.json"
  ltrain_files+=("$out/ltrain-$round.jsonl")
  pytorch_files+=("$out/pytorch-$round.json")
done
python3 scripts/report/bench_report.py --ltrain "${ltrain_files[@]}" --pytorch "${pytorch_files[@]}" \
  | tee "$out/step-table.md"
