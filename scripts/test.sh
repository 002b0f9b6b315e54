#!/usr/bin/env bash
# Sets up what the tests need (packages, every target of the build, the small data subset when
# available) and runs them.
#
#   bash scripts/test.sh                       # the build setup.sh makes here, in build/, every test
#   bash scripts/test.sh -L unit               # arguments other than the two below go to ctest
#   bash scripts/test.sh --cpu                 # the CPU build, even where a CUDA LibTorch is at hand
#   bash scripts/test.sh --build-dir DIR       # build and test in DIR instead of build/
#
# The PyTorch-side checks (torchvision parity, exports read by safetensors and torchvision, TensorBoard's
# own reader) use the project's .venv/ (bash scripts/python-env.sh) and skip without it, saying so;
# LTRAIN_REQUIRE_PYTHON_CHECKS=1 (CI) makes a missing package a failure instead.
set -euo pipefail
cd "$(dirname "$0")/.."

setup_args=(--no-data --all) ctest_args=() build_dir=build
while (($#)); do
  case "$1" in
    --cpu) setup_args+=(--cpu) ;;
    --build-dir) (($# >= 2)) || { echo "test: --build-dir needs a folder" >&2; exit 2; }
                 build_dir="$2"; setup_args+=(--build-dir "$2"); shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) ctest_args+=("$1") ;;
  esac
  shift
done
bash scripts/setup.sh "${setup_args[@]}"
# LTRAIN_NVCC chose the set-up's nvcc; the tests' own stand-ins for nvcc (tests/test_setup.cpp) answer unasked.
env -u LTRAIN_NVCC ctest --test-dir "$build_dir" --output-on-failure --timeout 900 "${ctest_args[@]}"
