#!/usr/bin/env bash
# Runs a PyTorch-side check (a Python script and its arguments) under the first Python that imports
# MODULES: $LTRAIN_PYTHON, the project's environment ($LTRAIN_VENV, default .venv/, made by
# scripts/python-env.sh), the plots' (.venv-plots/, python-env.sh --plots), /usr/bin/python3, python3
# on the PATH, as tests/support.cpp picks one. Without one it exits 77, which CTest reports as skipped,
# or fails when LTRAIN_REQUIRE_PYTHON_CHECKS=1 (CI).
#
#   tests/python_check.sh "torch, torchvision, safetensors" SCRIPT.py ARGS...
set -uo pipefail
modules="$1"
shift
source_dir="$(cd "$(dirname "$0")/.." && pwd)"
for python in "${LTRAIN_PYTHON:-}" "${LTRAIN_VENV:-$source_dir/.venv}/bin/python3" "$source_dir/.venv-plots/bin/python3" \
              /usr/bin/python3 python3; do
  [[ -n "$python" ]] || continue
  # find_spec finds a package without importing it (importing torch twice per test costs seconds).
  if "$python" -c "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m.strip()) is None for m in '$modules'.split(',')))" \
       >/dev/null 2>&1; then
    exec "$python" "$@"
  fi
done
message="no Python here imports $modules (bash scripts/python-env.sh makes .venv/ with them)"
if [[ "${LTRAIN_REQUIRE_PYTHON_CHECKS:-}" == 1 ]]; then
  echo "python_check: $message; LTRAIN_REQUIRE_PYTHON_CHECKS=1 makes that a failure" >&2
  exit 1
fi
echo "python_check: $message: skipped" >&2
exit 77
