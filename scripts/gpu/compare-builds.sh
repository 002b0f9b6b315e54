#!/usr/bin/env bash
# Two ltrain builds side by side on one GPU: the same `bench step` grid for each, rounds alternated
# (baseline first in odd rounds, candidate first in even ones) so that both see the host's drift
# alike. Writes OUT/builds.jsonl (one bench line per run, with "build" and "round" added) and
# OUT/builds-table.md (median img/s per build, and the median and range of the per-round ratios).
# One binary given as both, with --candidate-set KEY=VALUE (repeatable), compares a setting on and off;
# --set KEY=VALUE (repeatable) sets a key for both builds (e.g. data.image_size=16).
#
#   scripts/gpu/compare-builds.sh OUT --baseline BIN --candidate BIN [--config FILE]
#       [--batch-sizes "256 512 1024"] [--precision fp16] [--graph on] [--rounds 5] [--steps 100]
#       [--warmup 20] [--set KEY=VALUE]... [--candidate-set KEY=VALUE]...
set -euo pipefail
cd "$(dirname "$0")/../.."

out="${1:?usage: scripts/gpu/compare-builds.sh OUT --baseline BIN --candidate BIN [options]}"
shift
baseline="" candidate="" config=configs/bench/resnet50-step.json
batch_sizes="256 512 1024" precision=fp16 graph=on rounds=5 steps=100 warmup=20
candidate_sets=() common_sets=()
while (($#)); do
  (($# >= 2)) || { echo "compare-builds: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --baseline) baseline="$2" ;;
    --candidate) candidate="$2" ;;
    --config) config="$2" ;;
    --batch-sizes) batch_sizes="$2" ;;
    --precision) precision="$2" ;;
    --graph) graph="$2" ;;
    --rounds) rounds="$2" ;;
    --steps) steps="$2" ;;
    --warmup) warmup="$2" ;;
    --set) common_sets+=(--set "$2") ;;
    --candidate-set) candidate_sets+=(--set "$2") ;;
    *) echo "compare-builds: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
for binary in "$baseline" "$candidate"; do
  [[ -x "$binary" ]] || { echo "compare-builds: '$binary' is not an executable (--baseline/--candidate)" >&2; exit 2; }
done
mkdir -p "$out"
results="$out/builds.jsonl"
: >"$results"

run_one() {  # $1: build label, $2: binary, $3: round, $4: batch
  local sets=("${common_sets[@]}")
  [[ $1 == candidate ]] && sets+=("${candidate_sets[@]}")
  "$2" bench step --config "$config" --set "data.batch_size=$4" --set "precision.mode=$precision" \
    --set model.channels_last=true --set "cuda_graph.train=$([ "$graph" = on ] && echo true || echo false)" \
    "${sets[@]}" --warmup "$warmup" --steps "$steps" --json \
    | python3 -c 'import json,sys
for line in sys.stdin:
    r = json.loads(line); r.update(build=sys.argv[1], round=int(sys.argv[2])); print(json.dumps(r))' "$1" "$3" \
    | tee -a "$results"
}

for round in $(seq 1 "$rounds"); do
  for batch in $batch_sizes; do
    if ((round % 2)); then
      run_one baseline "$baseline" "$round" "$batch"; run_one candidate "$candidate" "$round" "$batch"
    else
      run_one candidate "$candidate" "$round" "$batch"; run_one baseline "$baseline" "$round" "$batch"
    fi
  done
done
python3 scripts/report/compare_builds_report.py "$results" | tee "$out/builds-table.md"
