#!/usr/bin/env bash
# How busy ltrain's graphed ResNet-50 step keeps the GPU, with the backward's weight gradients on
# one stream (cuda_graph.branches=off) and on a second one (on), on a GPU host: for each
# workload and setting, `ltrain bench step` times steps and profiles 5 more (CUPTI, a Chrome trace),
# alternating the two settings over the rounds; scripts/report/step_timeline.py turns the traces
# into the table. Writes OUT/<workload>-branches-<off|on>-r<R>.{json,trace.json}, OUT/rates.md (img/s
# per round, the ratio on/off) and OUT/timeline.md (the traces of the last round, then their idle
# stretches by the kernel families around them).
#
#   scripts/gpu/step-timeline.sh OUT [--ltrain build-gpu/ltrain] [--rounds 2] [--steps 40]
#                                [--workloads "imagenet-fp16-b256 imagenet-fp16-b1024 cifar-bf16-b512
#                                              cifar-bf16-b512-16px cifar-bf16-b512-24px"]
# Workloads: the guides' (imagenet stem, 32x32, fp16) at batch 256 and 1024; the recipes' (cifar
# stem, bf16, batch 512) at 32, 16 and 24 px, the sides of their progressive epochs; *-224px:
# imagenet stem at 224x224, batch 256. Every run: channels_last, graphed, synthetic data.
set -euo pipefail
cd "$(dirname "$0")/../.."

out="${1:?usage: scripts/gpu/step-timeline.sh OUT [options]}"
shift
ltrain=build-gpu/ltrain rounds=2 steps=40
workloads="imagenet-fp16-b256 imagenet-fp16-b1024 cifar-bf16-b512 cifar-bf16-b512-16px cifar-bf16-b512-24px"
while (($#)); do
  case "$1" in
    --ltrain) ltrain="$2" ;;
    --rounds) rounds="$2" ;;
    --steps) steps="$2" ;;
    --workloads) workloads="$2" ;;
    *) echo "step-timeline: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
mkdir -p "$out"

# workload_sets NAME: the config and --set overrides of a workload, one per line.
workload_sets() {
  local name="$1" stem precision batch size=32
  [[ "$name" =~ ^(imagenet|cifar)-(fp16|bf16)-b([0-9]+)(-([0-9]+)px)?$ ]] \
    || { echo "step-timeline: unknown workload $name" >&2; exit 2; }
  stem="${BASH_REMATCH[1]}" precision="${BASH_REMATCH[2]}" batch="${BASH_REMATCH[3]}"
  [ -z "${BASH_REMATCH[5]}" ] || size="${BASH_REMATCH[5]}"
  if [ "$stem" = imagenet ]; then echo configs/bench/resnet50-step.json; else echo configs/bench/resnet50-cifar-step.json; fi
  printf '%s\n' "data.batch_size=$batch" "precision.mode=$precision" "data.image_size=$size" \
    "model.channels_last=true" "cuda_graph.train=true"
}

: >"$out/rates.tsv"
for round in $(seq 1 "$rounds"); do
  for workload in $workloads; do
    mapfile -t sets < <(workload_sets "$workload")
    config="${sets[0]}"
    set_args=()
    for s in "${sets[@]:1}"; do set_args+=(--set "$s"); done
    # Rounds alternate which setting goes first, so that both meet the host's drift alike.
    order="off on"
    [ $((round % 2)) -eq 1 ] || order="on off"
    for branches in $order; do
      name="$workload-branches-$branches-r$round"
      "$ltrain" bench step --config "$config" "${set_args[@]}" --set "cuda_graph.branches=$branches" \
        --warmup 15 --steps "$steps" --json --profile "$out/$name.trace.json" >"$out/$name.json"
      measured=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['images_per_second'], r['peak_memory_bytes'])" "$out/$name.json")
      printf '%s\t%s\t%s\t%s\t%s\n' "$workload" "$round" "$branches" $measured | tee -a "$out/rates.tsv"
    done
  done
done

python3 - "$out/rates.tsv" >"$out/rates.md" <<'EOF'
import collections, sys
rates, peaks = collections.defaultdict(dict), collections.defaultdict(dict)
for line in open(sys.argv[1]):
    workload, round_, branches, rate, peak = line.split("\t")
    rates[(workload, int(round_))][branches] = float(rate)
    peaks[(workload, int(round_))][branches] = int(peak) / 2**30
print("| workload | round | img/s, one stream | img/s, branches | branches / one stream | peak GiB, one stream / branches |")
print("|---|---|---|---|---|---|")
for key, r in sorted(rates.items()):
    workload, round_ = key
    print(f"| {workload} | {round_} | {r['off']:,.0f} | {r['on']:,.0f} | {r['on'] / r['off']:.3f}x "
          f"| {peaks[key]['off']:.2f} / {peaks[key]['on']:.2f} |")
EOF
cat "$out/rates.md"
traces=()
for workload in $workloads; do
  for branches in off on; do traces+=("$out/$workload-branches-$branches-r$rounds.trace.json"); done
done
python3 scripts/report/step_timeline.py "${traces[@]}" --steps 5 --json "$out/timeline.json" --gaps | tee "$out/timeline.md"
