#!/usr/bin/env bash
# Stop-and-resume of a graphed fp16 run on a GPU host, and exported weights in torchvision:
#  1. ResNet-50 on DATA, fp16 with the GradScaler, channels_last, CUDA graphs for training and
#     evaluation, deterministic algorithms, a checkpoint every 10 steps: once straight through
#     ("whole"), once stopped with SIGTERM in its second epoch and resumed with
#     checkpoint.resume=auto ("split"); prints the largest loss difference and whether the loss
#     scales agree, step by step after the stop.
#  2. `ltrain export` of whole's last checkpoint, its accuracy in torchvision
#     (scripts/pytorch/export_accuracy.py) beside `ltrain eval` of the same checkpoint in fp32.
#
#   scripts/gpu/resume-check.sh OUT [DATA]      (DATA: data/cifar10-mini by default)
# Exit 1 when a check fails (the stopped run did not exit 130, scales differ, losses differ by
# more than 1e-3 relative, the accuracies differ by more than 0.1%).
set -euo pipefail
cd "$(dirname "$0")/../.."

out="${1:?usage: scripts/gpu/resume-check.sh OUT [DATA]}"
data="${2:-data/cifar10-mini}"
ltrain=build-gpu/ltrain
mkdir -p "$out"
run=("$ltrain" train --config configs/resnet50.json --set "data.root=$data" --set run.epochs=3
  --set precision.mode=fp16 --set model.channels_last=true --set precision.deterministic=true
  --set cuda_graph.train=true --set cuda_graph.eval=true --set checkpoint.every_steps=10
  --set run.log_every_steps=1 --set "run.out_dir=$out/runs" --set optim.lr=0.02 --set schedule.warmup_epochs=0)

"${run[@]}" --set run.name=whole >"$out/whole.log" 2>&1
"${run[@]}" --set run.name=split >"$out/split.log" 2>&1 &
pid=$!
stop_after=25
while kill -0 "$pid" 2>/dev/null; do
  logged=0
  [ -f "$out/runs/split/metrics.csv" ] && logged=$(($(wc -l <"$out/runs/split/metrics.csv") - 1))
  if [ "$logged" -ge "$stop_after" ]; then kill -TERM "$pid"; break; fi
  sleep 0.05
done
status=0
wait "$pid" || status=$?
echo "stopped run exit code: $status (expected 130)"
[ "$status" -eq 130 ] || exit 1
"${run[@]}" --set run.name=split --set checkpoint.resume=auto >"$out/resume.log" 2>&1
grep -h "resuming from" "$out/resume.log" | cut -c1-200

python3 - "$out/runs/whole/metrics.jsonl" "$out/runs/split/metrics.jsonl" <<'PY'
import json, sys
rows = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
# "run" rows say where each process started (the split run has two): not metrics to compare.
whole, split = ({(r["kind"], r["step"]): r for r in rs if r["kind"] != "run"} for rs in rows)
assert whole.keys() == split.keys(), "the two runs logged different steps"
worst, scales_equal, steps = 0.0, True, 0
for key, a in whole.items():
    b = split[key]
    if a["kind"] != "step":
        continue
    steps += 1
    worst = max(worst, abs(a["train_loss"] - b["train_loss"]) / abs(a["train_loss"]))
    scales_equal &= a.get("loss_scale") == b.get("loss_scale")
print(f"{steps} logged steps: largest relative loss difference {worst:.2e}; loss scales equal at every step: {scales_equal}")
last = max(k[1] for k in whole)
print(f"final loss scale {whole[('step', last)]['loss_scale']}, skipped steps {whole[('step', last)]['skipped_steps']}")
sys.exit(0 if scales_equal and worst <= 1e-3 else 1)
PY

last=$(ls "$out/runs/whole/checkpoints"/step-*.ltc | sort | tail -1)
"$ltrain" export --checkpoint "$last" --out "$out/whole.safetensors"
"$ltrain" eval --checkpoint "$last" --set "data.root=$data" --set precision.mode=fp32 --json | tee "$out/ltrain-eval.json"
python3 scripts/pytorch/export_accuracy.py "$out/whole.safetensors" --data "$data" --json \
  | tee "$out/torchvision-eval.json"
python3 - "$out/ltrain-eval.json" "$out/torchvision-eval.json" <<'PY'
import json, sys
ours, theirs = (json.load(open(p)) for p in sys.argv[1:])
print(f"ltrain eval {ours['correct']}/{ours['images']}, torchvision {theirs['correct']}/{theirs['images']}")
# Different convolution algorithms (NHWC in ltrain, NCHW here) may flip a near-tie: 0.1% allowed.
sys.exit(0 if ours["images"] == theirs["images"] and abs(ours["correct"] - theirs["correct"]) <= ours["images"] // 1000 else 1)
PY
