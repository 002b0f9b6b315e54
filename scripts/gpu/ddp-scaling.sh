#!/usr/bin/env bash
# Data-parallel scaling on one host's GPUs (after scripts/gpu/host-build.sh): ResNet-50 (imagenet
# stem, 32x32 synthetic images), fp16 with the GradScaler, channels_last, the whole step in a CUDA
# graph (collectives captured too), SGD with momentum, a fixed batch per GPU; `ltrain train` on
# 1 GPU and `ltrain launch -n N -- train` on N, in one run. Throughput is the median img/s of the
# logged intervals after the first (which holds the warm-up and the capture).
#
#   scripts/gpu/ddp-scaling.sh OUT [BATCH_PER_GPU] [STEPS] [GPU_COUNTS...]   (512 300 1 2)
#   LTRAIN_SETS="distributed.gradient_dtype=bf16" scripts/gpu/ddp-scaling.sh ...   (more --set, every run)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out="${1:?usage: scripts/gpu/ddp-scaling.sh OUT [BATCH_PER_GPU] [STEPS] [GPU_COUNTS...]}"
batch="${2:-512}" steps="${3:-300}"
shift $(( $# >= 3 ? 3 : $# ))
counts=("$@")
((${#counts[@]})) || counts=(1 2)
ltrain=build-gpu/ltrain
mkdir -p "$out"
max_count=1
for n in "${counts[@]}"; do (( n > max_count )) && max_count=$n; done
common=(train --config configs/bench/resnet50-step.json --set precision.mode=fp16 --set model.channels_last=true
  --set cuda_graph.train=true --set "data.batch_size=$batch" --set "run.max_steps=$steps" --set run.epochs=1
  --set schedule.warmup_epochs=0 --set run.log_every_steps=25 --set "data.synthetic_train_size=$(( batch * steps * max_count ))"
  --set "run.out_dir=$out/runs" --set checkpoint.every_epochs=0)
for extra in ${LTRAIN_SETS:-}; do common+=(--set "$extra"); done
for n in "${counts[@]}"; do
  echo "== $n GPU(s) ($(date -u +%H:%M:%S))"
  if (( n == 1 )); then
    "$ltrain" "${common[@]}" --set run.name=gpus-1 >"$out/gpus-1.log" 2>&1
  else
    "$ltrain" launch -n "$n" -- "${common[@]}" --set "run.name=gpus-$n" >"$out/gpus-$n.log" 2>&1
  fi
  echo "exit code $?"
  tail -n 2 "$out/gpus-$n.log"
done
python3 - "$out" "$batch" "${counts[@]}" <<'PY' | tee "$out/scaling.md"
import json, statistics, sys, pathlib
out, batch, counts = pathlib.Path(sys.argv[1]), int(sys.argv[2]), [int(c) for c in sys.argv[3:]]
rate = {}
for n in counts:
    path = out / "runs" / f"gpus-{n}" / "metrics.jsonl"
    if not path.exists():
        continue
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r["img_per_s"] for r in rows if r.get("kind") == "step"][1:]
    if steps:
        rate[n] = statistics.median(steps)
print(f"| GPUs | batch per GPU | img/s | speed-up over 1 GPU | scaling efficiency |")
print("|---:|---:|---:|---:|---:|")
for n in counts:
    if n in rate:
        up = rate[n] / rate[1] if 1 in rate else float("nan")
        print(f"| {n} | {batch} | {rate[n]:,.0f} | {up:.2f}x | {100 * up / n:.0f}% |")
    else:
        print(f"| {n} | {batch} | failed | | |")
PY
rm -rf "$out"/runs/*/checkpoints
