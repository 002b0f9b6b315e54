#!/usr/bin/env bash
# On a GPU host: build ltrain (scripts/gpu/host-build.sh), run the tests (the *_CUDA ones too),
# the torchvision parity check, the side-by-side step benchmark and, when the full CIFAR-10 is
# in data/, a real ResNet-50 training run. Logs and results go to OUT/ (results.tar.gz holds all).
#
#   scripts/gpu/check.sh OUT [--skip-build] [--train-epochs N]
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out="${1:?usage: scripts/gpu/check.sh OUT [--skip-build] [--train-epochs N]}"
shift
skip_build=0 epochs=10
while (($#)); do
  case "$1" in
    --skip-build) skip_build=1; shift ;;
    --train-epochs) epochs="$2"; shift 2 ;;
    *) echo "check: unknown option $1" >&2; exit 2 ;;
  esac
done
work="$out/work"
mkdir -p "$work"
status=0
step() { echo "== $* ($(date -u +%H:%M:%S))"; }

step "environment"
{ nvidia-smi; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())'; git log -1 --format='%H %cI'; } >"$work/env.txt" 2>&1

if ((!skip_build)); then
  step "build"
  if ! bash scripts/gpu/host-build.sh >"$work/build.log" 2>&1; then
    # Keep the run useful: report the warnings, then build without -Werror.
    echo "build with -Werror failed:"; grep -E "error|warning" "$work/build.log" | head -20; status=1
    bash scripts/gpu/host-build.sh --no-werror >"$work/build-nowerror.log" 2>&1 || tail -30 "$work/build-nowerror.log"
  fi
fi
[ -x build-gpu/ltrain ] || { echo "no build-gpu/ltrain"; tar -czf "$out/results.tar.gz" -C "$out" work; exit 1; }

step "tests"
ctest --test-dir build-gpu --output-on-failure --timeout 240 -j 8 >"$work/ctest.log" 2>&1 || status=1
tail -5 "$work/ctest.log"
grep -E "_CUDA|Failed|SKIPPED" "$work/ctest.log" | head -20

step "parity with torchvision"
python3 scripts/pytorch/parity_torchvision.py --ltrain-parity build-gpu/ltrain_parity --device cuda \
  --json "$work/parity.json" >"$work/parity.log" 2>&1 || status=1
tail -12 "$work/parity.log"

step "step benchmark, ltrain vs PyTorch"
bash scripts/gpu/bench-step.sh "$work/bench" >"$work/bench.log" 2>&1 || status=1
cat "$work/bench/step-table.md" 2>/dev/null || tail -20 "$work/bench.log"

# The full CIFAR-10 when present, else the real mini subset.
data_root=data/cifar-10-batches-bin
[ -f "$data_root/test_batch.bin" ] || data_root=data/cifar10-mini
if [ -f "$data_root/test_batch.bin" ]; then
  step "ResNet-50 on $data_root, $epochs epochs"
  build-gpu/ltrain train --config configs/resnet50.json --set run.out_dir="$work/runs" --set run.epochs="$epochs" \
    --set data.root="$data_root" --set precision.cudnn_benchmark=true >"$work/train-resnet50.log" 2>&1 || status=1
  grep -E "data |epoch .* test|done:|error" "$work/train-resnet50.log" | tail -14
fi

cp "$work"/bench/step-table.md "$work"/parity.json "$out/" 2>/dev/null
tar --exclude='*.ltc' -czf "$out/results.tar.gz" -C "$out" work
step "done, status $status"
exit $status
