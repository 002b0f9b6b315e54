#!/usr/bin/env bash
# Sets up ltrain on a fresh Debian/Ubuntu machine: apt packages, CIFAR-10, and the build.
# Idempotent: a second run only rebuilds what changed.
#
#   bash scripts/setup.sh            # packages + full CIFAR-10 + build
#   bash scripts/setup.sh --no-data  # packages + build (+ the small test subset when available)
set -euo pipefail
cd "$(dirname "$0")/.."

want_data=1
for arg in "$@"; do
  case "$arg" in
    --no-data) want_data=0 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

packages=(build-essential cmake ninja-build libtorch-dev libgloo-dev nlohmann-json3-dev libspdlog-dev libcxxopts-dev
          libgtest-dev xz-utils curl ca-certificates python3 python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ((want_data)); then
  bash scripts/get-cifar10.sh
fi
# The small real subset for tests, when this checkout sits beside the shared data.
if [ -d ../shared/data/cifar10-mini ] && [ ! -f data/cifar10-mini/test_batch.bin ]; then
  bash scripts/get-cifar10.sh --mini
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
echo "setup: done; build/ltrain --help"
