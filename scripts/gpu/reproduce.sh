#!/usr/bin/env bash
# The material of docs/REPRODUCE-H200.md, on a GPU host after scripts/gpu/host-build.sh:
#   doctor     `ltrain doctor --json`
#   matmul     the matmul test (n = 8192, 10 warm-up, 100 timed products per dtype), ltrain and
#              PyTorch Python alternately, twice each, in one run -> matmul.md
#   reproduce  `ltrain reproduce` on the ResNet-50 step config with channels_last at 32x32 (CIFAR's
#              size) and 224x224 (ImageNet's, random images), 3 alternating A/B rounds per claim,
#              8 untimed and 20 timed steps per measurement, its batch search included
#              -> reproduce/REPORT.md, results.json, claims.png, batch-search/
#   sweep      the batch sweep of ResNet-50 fp16 with CUDA graphs from 256 to 90% of the memory
#              (configs/sweeps/batch-resnet50-fp16.json) -> sweep/results.{csv,md,json}
# Plots are drawn where matplotlib imports (else later, from the JSON files, with
# scripts/report/plot_report.py OUT/reproduce and scripts/report/plot_sweep.py OUT/sweep).
#
#   scripts/gpu/reproduce.sh OUT [doctor] [matmul] [reproduce] [sweep]   (all four by default)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out="${1:?usage: scripts/gpu/reproduce.sh OUT [doctor] [matmul] [reproduce] [sweep]}"
shift
parts=("$@")
((${#parts[@]})) || parts=(doctor matmul reproduce sweep)
ltrain=build-gpu/ltrain
[[ -x "$ltrain" ]] || { echo "reproduce: no $ltrain; run scripts/gpu/host-build.sh first" >&2; exit 3; }
mkdir -p "$out"
status=0
step() { echo "== $* ($(date -u +%H:%M:%S))"; }

for part in "${parts[@]}"; do
  case "$part" in
    doctor)
      step doctor
      "$ltrain" doctor --json >"$out/doctor.json" 2>"$out/doctor.log" || status=1 ;;
    matmul)
      step "matmul, ltrain and PyTorch alternately"
      for round in 1 2; do
        "$ltrain" bench matmul --json >"$out/matmul-ltrain-$round.jsonl" 2>"$out/matmul-ltrain-$round.log" || status=1
        python3 scripts/pytorch/bench_pytorch.py --skip-train --matmul --json "$out/matmul-pytorch-$round.json" \
          >"$out/matmul-pytorch-$round.log" 2>&1 || status=1
      done
      python3 - "$out" >"$out/matmul.md" <<'PY' || status=1
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
ltrain, torch_rates = {}, {}
for r in (1, 2):
    for line in (out / f"matmul-ltrain-{r}.jsonl").read_text().splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            ltrain.setdefault(row["precision"], []).append(row["tflops"])
    for row in json.loads((out / f"matmul-pytorch-{r}.json").read_text())["matmul"]:
        torch_rates.setdefault(row["precision"], []).append(row.get("tflops"))
print("| dtype | ltrain TFLOP/s (round 1, 2) | PyTorch Python TFLOP/s (round 1, 2) | ltrain / PyTorch (best of each) |")
print("|---|---|---|---|")
for p in ("fp32", "tf32", "fp16", "bf16"):
    a, b = ltrain.get(p, []), [x for x in torch_rates.get(p, []) if x]
    ratio = "%.3f" % (max(a) / max(b)) if a and b else "-"
    print("| %s | %s | %s | %s |" % (p, ", ".join("%.1f" % x for x in a), ", ".join("%.1f" % x for x in b), ratio))
PY
      cat "$out/matmul.md" ;;
    reproduce)
      step reproduce
      "$ltrain" reproduce --config configs/bench/resnet50-step.json --set model.channels_last=true \
        --image-sizes 32,224 --rounds 3 --warmup 8 --steps 20 --out "$out/reproduce" >"$out/reproduce.log" 2>&1 || status=1
      tail -3 "$out/reproduce.log" ;;
    sweep)
      step "batch sweep to 90% of memory"
      "$ltrain" sweep --config configs/sweeps/batch-resnet50-fp16.json --out "$out/sweep" >"$out/sweep.log" 2>&1 || status=1
      cat "$out/sweep/results.md" 2>/dev/null ;;
    *) echo "reproduce: unknown part '$part' (doctor, matmul, reproduce, sweep)" >&2; exit 2 ;;
  esac
done

if python3 -c 'import matplotlib' 2>/dev/null; then
  [[ -d "$out/reproduce" ]] && python3 scripts/report/plot_report.py "$out/reproduce" >>"$out/plots.log" 2>&1
  [[ -d "$out/sweep" ]] && python3 scripts/report/plot_sweep.py "$out/sweep" >>"$out/plots.log" 2>&1
fi
step "done (status $status)"
exit "$status"
