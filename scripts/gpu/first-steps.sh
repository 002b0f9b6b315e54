#!/usr/bin/env bash
# The training loss of the first steps, step by step, under each execution path of the step
# (graphed, eager, ltrain's BatchNorm kernels or cuDNN's, fused or not, bf16 or fp32), for one epoch
# at a constant LR: the one-cycle schedule's starting LR, so the steps are those a recipe begins
# with. A loss spike at the start shows here, and which path it follows.
#
#   scripts/gpu/first-steps.sh OUT DATA_ROOT      # -> OUT/first-steps.txt, OUT/NAME.log (the console)
# LTRAIN=path the binary (build-gpu/ltrain).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out="${1:?usage: scripts/gpu/first-steps.sh OUT DATA_ROOT}"
data_root="${2:?DATA_ROOT: the folder with data_batch_1..5.bin and test_batch.bin}"
ltrain="${LTRAIN:-build-gpu/ltrain}"
mkdir -p "$out"
readonly R18=configs/accuracy/variants/resnet18-cifar-40ep.json     # one-cycle from 0.4 / 25
readonly R50=configs/accuracy/variants/resnet50-cifar-cutout8-40ep.json  # one-cycle from 0.5 / 25

probe() {  # NAME CONFIG OVERRIDES...
  local name="$1" config="$2"
  shift 2
  "$ltrain" train --config "$config" data.root="$data_root" run.out_dir="$out/runs" run.name="$name" run.epochs=1 \
    run.log_every_steps=1 run.eval_every_epochs=0 checkpoint.every_epochs=0 run.tensorboard=false \
    schedule.name=constant "$@" >"$out/$name.log" 2>&1
  printf '%s rc=%d ' "$name" "$?"
  python3 - "$out/runs/$name/metrics.jsonl" <<'PY'
import json, os, sys
if not os.path.exists(sys.argv[1]):
    sys.exit(print("no metrics (see the log)"))
steps = [row for row in map(json.loads, open(sys.argv[1])) if row.get("kind") == "step"]
later = steps[49:60]
print(" ".join("%.2f" % row["train_loss"] for row in steps[:14]),
      "| steps 50-60 mean %.3f" % (sum(row["train_loss"] for row in later) / max(len(later), 1)))
PY
}

# Each line: NAME rc=EXIT, the loss of steps 1-14, then the mean of steps 50-60.
{
  probe r18-default-a $R18 optim.lr=0.016
  probe r18-default-b $R18 optim.lr=0.016
  probe r18-eager $R18 optim.lr=0.016 cuda_graph.train=false
  probe r18-no-own-bn $R18 optim.lr=0.016 model.ltrain_batch_norm=false
  probe r18-no-fused-bn $R18 optim.lr=0.016 model.ltrain_batch_norm=false model.cudnn_batch_norm=false
  probe r18-fp32 $R18 optim.lr=0.016 precision.mode=fp32
  probe r18-lr-tiny $R18 optim.lr=1e-9
  probe r18-no-momentum $R18 optim.lr=0.016 optim.momentum=0 optim.nesterov=false
  probe r50-default $R50 optim.lr=0.02
} | tee "$out/first-steps.txt"
