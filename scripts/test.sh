#!/usr/bin/env bash
# Sets up what the tests need (packages, build, the small data subset when available) and runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-data
ctest --test-dir build --output-on-failure --timeout 900 "$@"
