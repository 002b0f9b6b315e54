#!/usr/bin/env bash
# The guides' own PyTorch recipes (scripts/pytorch/guides/) beside ltrain's configs of the same recipes
# (configs/articles/), on one GPU host, run one after the other and timed from outside.
#
#   scripts/gpu/articles.sh OUT DATA_ROOT [RECIPE ...] [--seeds "0 1 2"] [--epochs N] [--guides-together]
#   scripts/gpu/articles.sh out/articles /tmp/cifar/cifar-10-batches-bin 4090d --seeds "0 1 2"
#
# RECIPE is 5090, 4090 or 4090d (default: all three); seeds default to "0 1 2". For each recipe and
# seed the guide's script runs, then ltrain (guide seed 0, ltrain seed 0, guide seed 1, ...), so
# that drift of the host (clocks, heat) falls on both sides alike. Time to finish is measured from
# outside: wall seconds from launch to exit. --epochs N shortens both sides to N epochs, for
# speed-only measurements; the report then says "N epochs, not the guide's".
# --guides-together starts every guide run (each recipe and seed) at once and, when all have ended,
# runs ltrain's one after another: the guides' accuracy over seeds in the time of their slowest run.
# Their times then measure a shared host; the report gives no speed ratio for them.
#
# OUT/host.txt            GPUs, torch, ltrain --version, date, commit
# OUT/RECIPE/guide-seed-S.{log,json}   the guide's output; its result JSON with exit_code,
#                                      outside_wall_seconds and runs_at_once added
# OUT/RECIPE/ltrain-seed-S.{log,json}  ltrain's output; a record in the same terms as the guide's
# OUT/RECIPE/ltrain-seed-S/            ltrain's summary.json and metrics.jsonl (not checkpoints)
# OUT/articles.md, OUT/articles.png    scripts/report/articles_report.py's table and plot
#
# Needs scripts/gpu/host-build.sh first (LTRAIN=path overrides build-gpu/ltrain); PYTHON=path
# overrides the python3 that runs the guides' scripts (it needs torch and torchvision).
# Exit codes: 0 every run finished, 4 a run failed (the others still ran), 2 usage, 3 missing data,
# binary, config or script.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly repo
readonly all_recipes="5090 4090 4090d"

usage() {
  echo "usage: scripts/gpu/articles.sh OUT DATA_ROOT [5090|4090|4090d ...] [--seeds \"0 1 2\"] [--epochs N] [--guides-together]" >&2
  exit 2
}
die() { local code="$1"; shift; echo "articles: $*" >&2; exit "$code"; }

positional=()
seeds="0 1 2"
epochs=""
guides_together=0
while (($#)); do
  case "$1" in
    --seeds) (($# >= 2)) || usage; seeds="$2"; shift 2 ;;
    --seeds=*) seeds="${1#--seeds=}"; shift ;;
    --epochs) (($# >= 2)) || usage; epochs="$2"; shift 2 ;;
    --epochs=*) epochs="${1#--epochs=}"; shift ;;
    --guides-together) guides_together=1; shift ;;
    -h | --help) usage ;;
    -*) echo "articles: unknown option $1" >&2; usage ;;
    *) positional+=("$1"); shift ;;
  esac
done
((${#positional[@]} >= 2)) || usage
out="${positional[0]}"
data_root="${positional[1]}"
recipes=("${positional[@]:2}")
((${#recipes[@]})) || read -ra recipes <<<"$all_recipes"

for recipe in "${recipes[@]}"; do
  [[ " $all_recipes " == *" $recipe "* ]] || die 2 "unknown recipe $recipe: pick from $all_recipes"
done
read -ra seed_list <<<"$seeds"
((${#seed_list[@]})) || die 2 "--seeds \"$seeds\": give one or more integers"
for seed in "${seed_list[@]}"; do
  [[ "$seed" =~ ^[0-9]+$ ]] || die 2 "--seeds: $seed is not a non-negative integer"
done
[[ "$(printf '%s\n' "${seed_list[@]}" | sort | uniq -d)" == "" ]] || die 2 "--seeds \"$seeds\": a seed is repeated"
[[ -z "$epochs" || "$epochs" =~ ^[1-9][0-9]*$ ]] || die 2 "--epochs $epochs: give a positive integer"

for file in data_batch_{1..5}.bin test_batch.bin; do
  [[ -f "$data_root/$file" ]] || die 3 "$data_root has no $file: give the cifar-10-batches-bin folder"
done
ltrain="${LTRAIN:-$repo/build-gpu/ltrain}"
python="${PYTHON:-python3}"
[[ -x "$ltrain" ]] || die 3 "no ltrain binary at $ltrain: run scripts/gpu/host-build.sh or set LTRAIN=path"
for recipe in "${recipes[@]}"; do
  [[ -f "$repo/configs/articles/$recipe-guide.json" ]] || die 3 "no configs/articles/$recipe-guide.json"
  [[ -f "$repo/scripts/pytorch/guides/guide_$recipe.py" ]] || die 3 "no scripts/pytorch/guides/guide_$recipe.py"
done

mkdir -p "$out" || die 3 "cannot make $out"
out="$(cd "$out" && pwd)"
data_root="$(cd "$data_root" && pwd)"
scratch="$(mktemp -d)"  # ltrain's run directories with their checkpoints, outside OUT
trap 'rm -rf "$scratch"' EXIT

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    "($(git -C "$repo" status --porcelain 2>/dev/null | wc -l) files changed beside it)"
  echo "ltrain: $("$ltrain" --version 2>&1 | head -1)"
  echo "python: $("$python" -c 'import sys, torch, torchvision; print(sys.version.split()[0], "torch",
    torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
    "torchvision", torchvision.__version__)' 2>&1 | tail -1)"
  echo "gpus:"
  { nvidia-smi -L 2>&1 || echo "nvidia-smi -L failed"; } | sed 's/^/  /'
  echo "recipes: ${recipes[*]}; seeds: ${seed_list[*]}; epochs: ${epochs:-as each guide has them}"
} >"$out/host.txt"
cat "$out/host.txt"

seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }'; }

# record SIDE RECIPE SEED EXIT_CODE WALL RUNS_AT_ONCE: writes OUT/RECIPE/SIDE-seed-SEED.json. For the
# guide it adds the outside numbers to the script's own result; for ltrain it maps summary.json's keys.
record() {
  python3 - "$out" "$@" <<'PY'
import json, os, sys
out, side, recipe, seed, code, wall, runs_at_once = sys.argv[1:]
path = os.path.join(out, recipe, f"{side}-seed-{seed}.json")
result = {}
source = path if side == "guide" else os.path.join(out, recipe, f"ltrain-seed-{seed}", "summary.json")
try:
    with open(source) as f:
        loaded = json.load(f)
except (OSError, ValueError):
    loaded = None
if side == "guide" and loaded:
    result = loaded
elif loaded:
    result = {"test_accuracy": loaded.get("final_test_accuracy"), "epochs": loaded.get("epochs"),
              "train_seconds": loaded.get("train_seconds"), "images_per_second": loaded.get("images_per_second"),
              "peak_memory_bytes": loaded.get("peak_memory_bytes"), "inside_wall_seconds": loaded.get("wall_seconds")}
result.update({"side": side, "recipe": recipe, "seed": int(seed), "exit_code": int(code),
               "outside_wall_seconds": float(wall), "runs_at_once": int(runs_at_once)})
with open(path + ".tmp", "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
os.replace(path + ".tmp", path)
PY
}

failures=0
note() {  # RECIPE SIDE SEED EXIT_CODE WALL LOG
  local accuracy
  accuracy="$(grep -Eo 'test accuracy [0-9.]+%' "$6" | tail -1)"
  echo "   $1 $2 seed $3: exit $4, $5 s${accuracy:+, $accuracy}"
  (($4 == 0)) || failures=$((failures + 1))
}

run_guide() {  # RECIPE SEED RUNS_AT_ONCE
  local recipe="$1" seed="$2" together="$3" log cmd start code wall
  log="$out/$recipe/guide-seed-$seed.log"
  cmd=("$python" "$repo/scripts/pytorch/guides/guide_$recipe.py" --data "$data_root" --seed "$seed"
    --json "$out/$recipe/guide-seed-$seed.json" ${epochs:+--epochs "$epochs"})
  rm -f "$out/$recipe/guide-seed-$seed.json"
  echo "+ ${cmd[*]}" >"$log"
  start="$(date +%s.%N)"
  PYTHONUNBUFFERED=1 "${cmd[@]}" >>"$log" 2>&1
  code=$?
  wall="$(seconds_since "$start")"
  record guide "$recipe" "$seed" "$code" "$wall" "$together"
  note "$recipe" guide "$seed" "$code" "$wall" "$log"
}

run_ltrain() {  # RECIPE SEED
  local recipe="$1" seed="$2" log cmd start code wall file
  log="$out/$recipe/ltrain-seed-$seed.log"
  cmd=("$ltrain" train --config "$repo/configs/articles/$recipe-guide.json" --set "data.root=$data_root"
    --set "run.seed=$seed" --set "run.out_dir=$scratch/$recipe" --set "run.name=seed-$seed"
    ${epochs:+--set "run.epochs=$epochs"})
  rm -rf "$out/$recipe/ltrain-seed-$seed"
  mkdir -p "$out/$recipe/ltrain-seed-$seed"
  echo "+ ${cmd[*]}" >"$log"
  start="$(date +%s.%N)"
  "${cmd[@]}" >>"$log" 2>&1
  code=$?
  wall="$(seconds_since "$start")"
  for file in summary.json metrics.jsonl; do
    cp "$scratch/$recipe/seed-$seed/$file" "$out/$recipe/ltrain-seed-$seed/" 2>/dev/null
  done
  rm -rf "${scratch:?}/$recipe/seed-$seed"  # checkpoints: not kept, and they fill the disk
  record ltrain "$recipe" "$seed" "$code" "$wall" 1
  note "$recipe" ltrain "$seed" "$code" "$wall" "$log"
}

for recipe in "${recipes[@]}"; do mkdir -p "$out/$recipe"; done
if ((guides_together)); then
  # Every guide run at once (their accuracy does not depend on the host's load; their times do),
  # then ltrain's runs one after another on the idle host.
  runs_at_once=$((${#recipes[@]} * ${#seed_list[@]}))
  echo "== the guides' $runs_at_once runs at once ($(date -u +%H:%M:%S))"
  for recipe in "${recipes[@]}"; do
    for seed in "${seed_list[@]}"; do run_guide "$recipe" "$seed" "$runs_at_once" & done
  done
  wait
  for recipe in "${recipes[@]}"; do  # the background runs' failures, counted here
    for seed in "${seed_list[@]}"; do
      python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["exit_code"] != 0)' \
        "$out/$recipe/guide-seed-$seed.json" 2>/dev/null || failures=$((failures + 1))
    done
  done
  for recipe in "${recipes[@]}"; do
    for seed in "${seed_list[@]}"; do
      echo "== $recipe ltrain seed $seed ($(date -u +%H:%M:%S))"
      run_ltrain "$recipe" "$seed"
    done
  done
else
  for recipe in "${recipes[@]}"; do
    for seed in "${seed_list[@]}"; do
      echo "== $recipe seed $seed ($(date -u +%H:%M:%S))"
      run_guide "$recipe" "$seed" 1
      run_ltrain "$recipe" "$seed"
    done
  done
fi

python3 "$repo/scripts/report/articles_report.py" "$out" --md "$out/articles.md" --plot "$out/articles.png" ||
  failures=$((failures + 1))
((failures == 0)) || { echo "articles: $failures run(s) failed; see the logs in $out" >&2; exit 4; }
