#!/usr/bin/env bash
# The lower bound of ResNet-50's training step beside the measured step, on a GPU host: measures
# the device's rates (scripts/pytorch/device_rates.py: HBM bandwidth, the kernel floor inside a
# graph; `ltrain bench matmul`: the 16-bit matmul rate), profiles ltrain's graphed step at each
# workload and runs scripts/report/step_model.py on all of it.
#
#   scripts/gpu/step-bounds.sh OUT [--ltrain build-gpu/ltrain]
#
# Workloads: imagenet stem fp16 at batch 256 and 1024, cifar stem bf16 at 512 (channels_last,
# whole-step graph, synthetic CIFAR-sized images).
# OUT/rates.json, OUT/matmul.jsonl           the measured rates
# OUT/WORKLOAD.trace.json, WORKLOAD.json     the profile and `ltrain bench step`'s result
# OUT/step-bounds.md                         step_model.py's tables, one per workload
# Exit codes: 0 ok, 2 usage, 3 no ltrain binary, 4 a measurement failed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
usage() { echo "usage: scripts/gpu/step-bounds.sh OUT [--ltrain PATH]" >&2; exit 2; }
(($# >= 1)) || usage
out="$1"; shift
ltrain="$repo/build-gpu/ltrain"
while (($#)); do
  case "$1" in
    --ltrain) (($# >= 2)) || usage; ltrain="$2"; shift 2 ;;
    *) usage ;;
  esac
done
[[ -x "$ltrain" ]] || { echo "step-bounds: no ltrain binary at $ltrain: build with scripts/gpu/host-build.sh" >&2; exit 3; }
mkdir -p "$out"
fail() { echo "step-bounds: $*" >&2; exit 4; }

python3 "$repo/scripts/pytorch/device_rates.py" --json "$out/rates.json" || fail "device_rates.py failed"
"$ltrain" bench matmul --precision fp16,bf16 --json >"$out/matmul.jsonl" || fail "ltrain bench matmul failed"
read -r hbm floor < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["hbm_tbs"], r["kernel_floor_us"])' "$out/rates.json")

# name stem precision batch
workloads=("imagenet-fp16-b256 imagenet fp16 256" "imagenet-fp16-b1024 imagenet fp16 1024" "cifar-bf16-b512 cifar bf16 512")
: >"$out/step-bounds.md"
for workload in "${workloads[@]}"; do
  read -r name stem precision batch <<<"$workload"
  "$ltrain" bench step --config "$repo/configs/bench/resnet50-step.json" --warmup 20 --steps 50 --json \
    --profile "$out/$name.trace.json" model.stem="$stem" precision.mode="$precision" data.batch_size="$batch" \
    model.channels_last=true cuda_graph.train=true >"$out/$name.json" || fail "ltrain bench step $name failed"
  read -r img_per_s < <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_per_second"])' "$out/$name.json")
  matmul=$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["precision"] == sys.argv[2]: print(r["tflops"])' "$out/matmul.jsonl" "$precision")
  {
    echo "## $name"
    echo
    python3 "$repo/scripts/report/step_model.py" --batch "$batch" --stem "$stem" --bandwidth-tbs "$hbm" \
      --matmul-tflops "$matmul" --kernel-floor-us "$floor" --measured-img-per-s "$img_per_s" \
      --trace "$out/$name.trace.json" --steps 5
    echo
  } >>"$out/step-bounds.md" || fail "step_model.py failed on $name"
done
cat "$out/step-bounds.md"
