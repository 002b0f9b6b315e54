#!/usr/bin/env bash
# Accuracy runs (docs/ACCURACY.md) on a GPU host: every recipe x seed on the full CIFAR-10 (or
# CIFAR-100, for a recipe with data.source cifar100 and DATA_ROOT its cifar-100-binary/), spread
# over the host's GPUs (one run per GPU at a time). Each run's metrics.jsonl, train.log and
# summary.json are kept in OUT/RECIPE/seed-S/ (checkpoints are not), and OUT/accuracy.md gets the
# table: accuracy at the end (mean, min-max over seeds), best epoch's, run time, training time,
# set-up time.
#
#   scripts/gpu/accuracy.sh OUT DATA_ROOT "RECIPE.json ..." "SEEDS" [--set KEY=VALUE ...]
#   scripts/gpu/accuracy.sh out /tmp/cifar/cifar-10-batches-bin "configs/accuracy/resnet18-cifar.json" "0 1 2"
#   scripts/gpu/accuracy.sh out /tmp/cifar/cifar-100-binary "configs/cifar100/resnet50.json" "0 1 2"
# GPUS=N overrides the GPU count (default: nvidia-smi -L); RUNS_PER_GPU=N runs N at a time on each
# GPU (default 1; more only to compare recipes' accuracy, as runs sharing a GPU are slower);
# LTRAIN=path the binary (build-gpu/ltrain).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out="${1:?usage: scripts/gpu/accuracy.sh OUT DATA_ROOT RECIPES SEEDS [--set KEY=VALUE ...]}"
data_root="${2:?DATA_ROOT: the folder with data_batch_1..5.bin and test_batch.bin (CIFAR-100: train.bin and test.bin)}"
recipes="${3:?RECIPES: config files}"
seeds="${4:?SEEDS: e.g. \"0 1 2\"}"
shift 4
extra=("$@")
ltrain="${LTRAIN:-build-gpu/ltrain}"
gpus="${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}"
((gpus > 0)) || gpus=1
runs_per_gpu="${RUNS_PER_GPU:-1}"
[[ -f "$data_root/test_batch.bin" || -f "$data_root/test.bin" ]] \
  || { echo "accuracy: $data_root has neither CIFAR-10's test_batch.bin nor CIFAR-100's test.bin" >&2; exit 2; }
mkdir -p "$out"
scratch="$(mktemp -d)"  # run directories with their checkpoints, outside OUT

jobs=()
for recipe in $recipes; do
  [[ -f "$recipe" ]] || { echo "accuracy: no recipe $recipe" >&2; exit 2; }
  for seed in $seeds; do jobs+=("$recipe:$seed"); done
done

run_one() {  # $1 recipe, $2 seed, $3 GPU index
  local name
  name="$(basename "$1" .json)"
  echo "== $name seed $2 on GPU $3 ($(date -u +%H:%M:%S))"
  CUDA_VISIBLE_DEVICES="$3" "$ltrain" train --config "$1" --set "data.root=$data_root" --set "run.seed=$2" \
    --set "run.out_dir=$scratch/$name" --set "run.name=seed-$2" "${extra[@]}" >"$scratch/$name-seed-$2.log" 2>&1
  echo "   $name seed $2: exit $? ($(grep -o 'test accuracy [0-9.]*%' "$scratch/$name-seed-$2.log" | tail -1))"
  mkdir -p "$out/$name/seed-$2"
  for file in metrics.jsonl train.log summary.json; do
    cp "$scratch/$name/seed-$2/$file" "$out/$name/seed-$2/" 2>/dev/null
  done
}

# Worker w (on GPU w % gpus) takes jobs w, w + workers, w + 2 * workers, ...
workers=$((gpus * runs_per_gpu))
for ((w = 0; w < workers; ++w)); do
  (
    for ((j = w; j < ${#jobs[@]}; j += workers)); do run_one "${jobs[j]%%:*}" "${jobs[j]##*:}" "$((w % gpus))"; done
  ) &
done
wait
rm -rf "$scratch"

python3 - "$out" <<'PY' | tee "$out/accuracy.md"
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
print("| recipe | seeds | test accuracy at the end: mean (min-max) | best epoch's | run time | training | set-up "
      "| training img/s |")
print("|---|---|---|---|---|---|---|---|")
for recipe in sorted(p for p in out.iterdir() if p.is_dir()):
    runs = []
    for seed_dir in sorted(recipe.glob("seed-*")):
        summary = seed_dir / "summary.json"
        if summary.exists():
            runs.append((seed_dir.name[5:], json.loads(summary.read_text())))
    if not runs:
        print(f"| {recipe.name} | none finished | | | | | | |")
        continue
    final = [100 * s["final_test_accuracy"] for _, s in runs]

    def each(key, spec):
        return " / ".join(spec.format(s[key]) if key in s else "?" for _, s in runs)

    print(f"| {recipe.name} | {', '.join(seed for seed, _ in runs)} "
          f"| {statistics.mean(final):.2f}% ({min(final):.2f}-{max(final):.2f}) "
          f"| {each('best_test_accuracy', '{:.2%}')} | {each('wall_seconds', '{:.1f} s')} "
          f"| {each('train_seconds', '{:.1f} s')} | {each('startup_seconds', '{:.1f} s')} "
          f"| {each('images_per_second', '{:,.0f}')} |")
PY
