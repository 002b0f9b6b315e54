#!/usr/bin/env bash
# Data-parallel scaling on one host's GPUs (after scripts/gpu/host-build.sh): ResNet-50 (imagenet
# stem, 32x32 synthetic images), fp16 with the GradScaler, channels_last, the whole step in a CUDA
# graph (collectives captured too), SGD with momentum, a fixed batch per GPU; `ltrain train` on
# 1 GPU and `ltrain launch -n N -- train` on N. Throughput is the median img/s of the logged
# intervals after the first (which holds the warm-up and the capture).
# With PYTORCH=1, each round also runs PyTorch's DistributedDataParallel on the same GPUs with the
# same batch per GPU (scripts/pytorch/ddp_baseline.py under torchrun: autocast, channels_last,
# gradient_as_bucket_view, static_graph, the step captured in a CUDA graph where that works), the
# two alternating which runs first, and the table gives both and their ratio per round.
#
#   scripts/gpu/ddp-scaling.sh OUT [BATCH_PER_GPU] [STEPS] [GPU_COUNTS...]   (512 300 1 2)
#   LTRAIN_SETS="distributed.gradient_dtype=bf16" scripts/gpu/ddp-scaling.sh ...   (more --set, every run)
#   ROUNDS=3 PYTORCH=1 scripts/gpu/ddp-scaling.sh OUT 512 300 1 2                  (beside PyTorch DDP)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out="${1:?usage: scripts/gpu/ddp-scaling.sh OUT [BATCH_PER_GPU] [STEPS] [GPU_COUNTS...]}"
batch="${2:-512}" steps="${3:-300}"
shift $(( $# >= 3 ? 3 : $# ))
counts=("$@")
((${#counts[@]})) || counts=(1 2)
rounds="${ROUNDS:-1}" pytorch="${PYTORCH:-0}"
ltrain=build-gpu/ltrain
mkdir -p "$out"
max_count=1
for n in "${counts[@]}"; do (( n > max_count )) && max_count=$n; done
common=(train --config configs/bench/resnet50-step.json --set precision.mode=fp16 --set model.channels_last=true
  --set cuda_graph.train=true --set "data.batch_size=$batch" --set "run.max_steps=$steps" --set run.epochs=1
  --set schedule.warmup_epochs=0 --set run.log_every_steps=25 --set "data.synthetic_train_size=$(( batch * steps * max_count ))"
  --set "run.out_dir=$out/runs" --set checkpoint.every_epochs=0)
for extra in ${LTRAIN_SETS:-}; do common+=(--set "$extra"); done

run_ltrain() {  # $1: GPUs, $2: round
  local name="gpus-$1-round-$2"
  if (( $1 == 1 )); then
    "$ltrain" "${common[@]}" --set "run.name=$name" >"$out/$name.log" 2>&1
  else
    "$ltrain" launch -n "$1" -- "${common[@]}" --set "run.name=$name" >"$out/$name.log" 2>&1
  fi
  echo "ltrain on $1 GPU(s), round $2: exit code $?"
}

run_pytorch() {  # $1: GPUs, $2: round
  local name="pytorch-gpus-$1-round-$2"
  (cd scripts/pytorch && torchrun --standalone --nproc-per-node "$1" ddp_baseline.py --arch resnet50 --stem imagenet \
     --batch "$batch" --precision fp16 --steps "$steps" --warmup 20 --graph --json "$out/$name.json") >"$out/$name.log" 2>&1
  echo "PyTorch DDP on $1 GPU(s), round $2: exit code $?"
}

for round in $(seq 1 "$rounds"); do
  for n in "${counts[@]}"; do
    echo "== $n GPU(s), round $round ($(date -u +%H:%M:%S))"
    if (( pytorch && round % 2 == 0 )); then run_pytorch "$n" "$round"; run_ltrain "$n" "$round"
    else run_ltrain "$n" "$round"; (( pytorch )) && run_pytorch "$n" "$round"; fi
  done
done
python3 - "$out" "$batch" "$rounds" "${counts[@]}" <<'PY' | tee "$out/scaling.md"
import json, statistics, sys, pathlib
out, batch, rounds, counts = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), [int(c) for c in sys.argv[4:]]

def ltrain_rate(n, r):
    path = out / "runs" / f"gpus-{n}-round-{r}" / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [row["img_per_s"] for row in rows if row.get("kind") == "step"][1:]
    return statistics.median(steps) if steps else None

def pytorch_rate(n, r):
    path = out / f"pytorch-gpus-{n}-round-{r}.json"
    return json.loads(path.read_text())["images_per_second"] if path.exists() else None

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None

ltrain = {n: [ltrain_rate(n, r) for r in range(1, rounds + 1)] for n in counts}
pytorch = {n: [pytorch_rate(n, r) for r in range(1, rounds + 1)] for n in counts}
with_pytorch = any(v is not None for values in pytorch.values() for v in values)
one = median(ltrain.get(1, []))
head = "| GPUs | batch per GPU | ltrain img/s | speed-up over 1 GPU | scaling efficiency |"
if with_pytorch:
    head += " PyTorch DDP img/s | ltrain / DDP (median, range) |"
print(head)
print("|" + "---:|" * (head.count("|") - 1))
for n in counts:
    rate = median(ltrain[n])
    if rate is None:
        print(f"| {n} | {batch} | failed | | |" + (" | |" if with_pytorch else ""))
        continue
    up = rate / one if one else float("nan")
    line = f"| {n} | {batch} | {rate:,.0f} | {up:.2f}x | {100 * up / n:.0f}% |"
    if with_pytorch:
        ratios = [a / b for a, b in zip(ltrain[n], pytorch[n]) if a and b]
        ddp = median(pytorch[n])
        line += f" {ddp:,.0f} |" if ddp else " failed |"
        line += f" {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |" if ratios else " |"
    print(line)
print(f"\n{rounds} round(s); img/s: the median over rounds (ltrain: of each run's logged intervals after the first).")
PY
rm -rf "$out"/runs/*/checkpoints
