#!/usr/bin/env bash
# The paths other GPUs take, proven on the GPU at hand (an H200): ltrain built for its default
# architecture list, for sm_80 PTX only (the driver compiles it at load time, as on a GPU newer
# than the build), and for sm_89 machine code only (no code for this GPU: every own kernel gives
# way to LibTorch's and cuDNN's), and the default build planning for an RTX 4090's limits
# (LTRAIN_GPU_PROFILE=rtx4090: 128 SMs, 100 KiB shared memory per SM, no clusters, 24 GiB).
# One phase per run, so that each run on the GPU host stays short; the binaries of the
# build phases are kept in $LTRAIN_MODES_DIR (default /tmp/ltrain-modes) for the bench phase.
#
#   scripts/gpu/portability.sh OUT build-default   # build, what the binary carries, doctor, GPU tests (default, rtx4090)
#   scripts/gpu/portability.sh OUT build-ptx80     # the same for an sm_80-PTX-only build
#   scripts/gpu/portability.sh OUT build-noimage   # ... an sm_89-only build, and a graphed fp16 training run
#   scripts/gpu/portability.sh OUT bench [ROUNDS]  # img/s of each mode at batch 256 and 512, fp16 graphed, rounds alternated
#   scripts/gpu/portability.sh OUT batch-search    # the batch-size search within an RTX 4090's 24 GiB
#   scripts/gpu/portability.sh OUT recipes         # each accuracy recipe's step and memory within a 4090's and a 5090's limits
# Everything is logged under OUT; OUT/results.tar.gz holds it all.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

out="${1:?usage: scripts/gpu/portability.sh OUT PHASE}"
phase="${2:?usage: scripts/gpu/portability.sh OUT PHASE}"
modes_dir="${LTRAIN_MODES_DIR:-/tmp/ltrain-modes}"
mkdir -p "$out" "$modes_dir"
status=0
step() { echo "== $* ($(date -u +%H:%M:%S))"; }

# build NAME ARCH: build-gpu for CMAKE_CUDA_ARCHITECTURES=ARCH ("" for the default list), with
# warnings as errors; keeps the binary as $modes_dir/ltrain-NAME and says what it carries.
build() {
  local name="$1" arch="$2" args=(--werror)
  # The default list: forget an architecture list an earlier build left in the CMake cache.
  if [[ -n "$arch" ]]; then args+=(--cuda-arch "$arch"); else args+=(-- -UCMAKE_CUDA_ARCHITECTURES); fi
  step "build $name (${arch:-default list})"
  if ! bash scripts/gpu/host-build.sh "${args[@]}" >"$out/build-$name.log" 2>&1; then
    tail -30 "$out/build-$name.log"
    status=1
    return 1
  fi
  grep -E "ltrain: CUDA kernels for|ltrain: LibTorch" "$out/build-$name.log"
  # ltrain-core is the program itself (the launcher, ltrain, only runs the one beside it): each mode's copy.
  cp build-gpu/ltrain-core "$modes_dir/ltrain-$name"
  if command -v cuobjdump >/dev/null; then
    { cuobjdump --list-elf build-gpu/ltrain-core; cuobjdump --list-ptx build-gpu/ltrain-core; } >"$out/cuobjdump-$name.txt" 2>&1
    echo "kernels carried: $(grep -oE 'sm_[0-9]+a?' "$out/cuobjdump-$name.txt" | sort -u | paste -sd' ') (machine code)," \
         "$(grep -c '\.ptx' "$out/cuobjdump-$name.txt") PTX file(s) $(grep -oE 'sm_[0-9]+a?\.ptx' "$out/cuobjdump-$name.txt" | sort -u | paste -sd' ')"
  fi
}

# gpu_tests NAME [ENV...]: the *_CUDA tests (graphed and eager steps, every own kernel) of build-gpu.
gpu_tests() {
  local name="$1"
  shift
  step "GPU tests, $name"
  if ! env "$@" ctest --test-dir build-gpu -R "_CUDA" --output-on-failure --timeout 300 >"$out/ctest-$name.log" 2>&1; then
    status=1
  fi
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$out/ctest-$name.log"
}

doctor() {
  local name="$1"
  shift
  env "$@" "$modes_dir/ltrain-${name%%-*}" doctor >"$out/doctor-$name.txt" 2>&1 || status=1
  sed -n '/^GPU 0/,$p' "$out/doctor-$name.txt"
}

# The fp16 graphed ResNet-50 step of configs/bench/resnet50-step.json, one JSON line per run.
bench_mode() {
  local mode="$1" batch="$2" binary="$modes_dir/ltrain-${1%%-*}" environment=()
  [[ "$mode" == *-rtx4090 ]] && environment=(LTRAIN_GPU_PROFILE=rtx4090)
  env "${environment[@]}" "$binary" bench step --config configs/bench/resnet50-step.json --warmup 20 --steps 100 \
    --set precision.mode=fp16 --set model.channels_last=true --set cuda_graph.train=true \
    --set data.batch_size="$batch" --json 2>>"$out/bench.log" \
    | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["mode"]=sys.argv[1]; print(json.dumps(r))' "$mode" \
    >>"$out/bench.jsonl" || { echo "bench $mode $batch failed"; status=1; }
}

case "$phase" in
  build-default)
    { nvidia-smi; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.backends.cudnn.version())';
      nvcc --version | tail -2; } >"$out/environment.txt" 2>&1
    build default "" && {
      doctor default
      doctor default-rtx4090 LTRAIN_GPU_PROFILE=rtx4090
      gpu_tests default
      gpu_tests default-rtx4090 LTRAIN_GPU_PROFILE=rtx4090
    } ;;
  build-ptx80)
    build ptx80 "80-virtual" && { doctor ptx80; gpu_tests ptx80; } ;;
  build-noimage)
    build noimage "89-real" && {
      doctor noimage
      gpu_tests noimage
      step "a graphed fp16 training run without code for this GPU"
      "$modes_dir/ltrain-noimage" train --config configs/bench/resnet50-step.json --set run.out_dir="$out/runs" \
        --set run.epochs=2 --set run.max_steps=40 --set run.log_every_steps=10 --set precision.mode=fp16 \
        --set model.channels_last=true --set cuda_graph.train=true --set data.batch_size=256 \
        >"$out/train-noimage.log" 2>&1 || status=1
      grep -E "warning|step +40|done|error" "$out/train-noimage.log" | head -12
    } ;;
  bench)
    rounds="${3:-2}"
    step "fp16 graphed ResNet-50 steps, $rounds round(s) alternating the modes"
    for ((round = 1; round <= rounds; round++)); do
      for batch in 256 512; do
        for mode in default default-rtx4090 ptx80 noimage; do
          [[ -x "$modes_dir/ltrain-${mode%%-*}" ]] && bench_mode "$mode" "$batch"
        done
      done
    done
    python3 - "$out/bench.jsonl" <<'EOF'
import collections, json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
runs = collections.defaultdict(list)
for r in rows:
    runs[(r["mode"], r["batch_size"])].append(r["images_per_second"])
print("| mode | batch | img/s (median of rounds) | rounds | vs default |")
print("|---|---|---|---|---|")
for (mode, batch), values in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
    base = statistics.median(runs[("default", batch)]) if ("default", batch) in runs else None
    median = statistics.median(values)
    ratio = f"{median / base:.2f}x" if base else "-"
    print(f"| {mode} | {batch} | {median:,.0f} ({min(values):,.0f}-{max(values):,.0f}) | {len(values)} | {ratio} |")
EOF
    ;;
  batch-search)
    step "batch-size search within an RTX 4090's 24 GiB (LTRAIN_GPU_PROFILE=rtx4090)"
    LTRAIN_GPU_PROFILE=rtx4090 "$modes_dir/ltrain-default" sweep --config configs/sweeps/batch-resnet50-fp16.json \
      --out "$out/batch-search-rtx4090" >"$out/batch-search.log" 2>&1 || status=1
    cat "$out/batch-search-rtx4090/results.md" 2>/dev/null || tail -20 "$out/batch-search.log" ;;
  recipes)
    step "the accuracy recipes' steps within consumer cards' limits (synthetic data of the same shapes)"
    for profile in rtx4090 rtx5090; do
      for recipe in configs/accuracy/resnet18-cifar.json configs/accuracy/resnet50-cifar.json; do
        LTRAIN_GPU_PROFILE=$profile "$modes_dir/ltrain-default" bench step --config "$recipe" --warmup 20 --steps 50 \
          --set data.source=synthetic --json 2>>"$out/recipes.log" \
          | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["profile"]=sys.argv[1]; r["recipe"]=sys.argv[2]; print(json.dumps(r))' \
            "$profile" "$recipe" >>"$out/recipes.jsonl" || { echo "$recipe under $profile failed"; status=1; }
      done
    done
    python3 - "$out/recipes.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print("{} {}: batch {}, {:,.0f} img/s, peak {:.1f} GiB allocated, {:.1f} GiB reserved".format(
        r["profile"], r["recipe"], r["batch_size"], r["images_per_second"], r["peak_memory_bytes"] / 2**30,
        r["peak_reserved_bytes"] / 2**30))
EOF
    ;;
  *) echo "portability: unknown phase $phase" >&2; exit 2 ;;
esac

tar --exclude='*.ltc' -czf "$out/results.tar.gz" -C "$out" --exclude=results.tar.gz .
step "done, status $status"
exit $status
