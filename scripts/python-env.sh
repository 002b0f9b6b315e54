#!/usr/bin/env bash
# Makes ltrain's Python environment: a virtual environment (.venv/ by default) holding the versions
# pinned in scripts/requirements.txt: a CUDA torch from PyPI (the CUDA build's LibTorch), NVIDIA's
# CUDA toolchain wheels (the CUDA build's nvcc, where the machine has no CUDA toolkit of torch's
# version), torchvision, safetensors, tensorboard, numpy and matplotlib (the PyTorch-side tests and
# the report scripts). About 5 GB. Idempotent: a second run with the same pins only checks it.
# --plots makes the light one instead: numpy and matplotlib alone (scripts/requirements-plots.txt,
# about 200 MB) in .venv-plots/, which the plot and report scripts (scripts/report/) need.
#
#   bash scripts/python-env.sh                 # -> .venv/ (or $LTRAIN_VENV)
#   bash scripts/python-env.sh --plots         # -> .venv-plots/: the plot and report scripts' packages
#   bash scripts/python-env.sh --venv DIR      # another folder
#   source .venv/bin/activate && bash scripts/setup.sh   # then: the CUDA build against its torch
#
# Environment: PYTHON (default python3) makes the environment; pip's own cache and settings apply.
# Exit codes: 0 ok, 2 usage, 3 a prerequisite missing or a download failed (the message says what to do).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { local code="$1"; shift; echo "python-env: $*" >&2; exit "$code"; }
info() { echo "python-env: $*"; }

venv="" plots=0
while (($#)); do
  case "$1" in
    --venv) (($# >= 2)) || die 2 "--venv needs a folder"; venv="$2"; shift 2 ;;
    --plots) plots=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) die 2 "unknown option $1 (see --help)" ;;
  esac
done
if ((plots)); then
  readonly requirements=scripts/requirements-plots.txt check_module=matplotlib what="numpy and matplotlib: about 200 MB"
  venv="${venv:-.venv-plots}"
else
  readonly requirements=scripts/requirements.txt check_module=torch
  readonly what="torch, its CUDA libraries and NVIDIA's CUDA toolchain: about 5 GB, pip's cache keeps the downloads"
  venv="${venv:-${LTRAIN_VENV:-.venv}}"
fi
python="${PYTHON:-python3}"
command -v "$python" >/dev/null || die 3 "$python not found: install Python 3.10 or later (apt-get install python3 python3-venv)"

# The pins' checksum, kept in the environment: the same one means nothing to install.
stamp_file="$venv/.ltrain-requirements"
stamp="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python3" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]] \
   && "$venv/bin/python3" -c "import $check_module" 2>/dev/null; then
  info "$venv is up to date with $requirements"
else
  if [[ ! -x "$venv/bin/python3" ]]; then
    info "making $venv with $("$python" --version 2>&1) ($(command -v "$python"))"
    if ! "$python" -m venv "$venv" 2>/dev/null; then
      # Debian and Ubuntu ship venv's pip bootstrap apart (python3-venv).
      rm -rf "$venv"
      if command -v apt-get >/dev/null; then
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        info "installing python3-venv"
        { $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends python3-venv; } >/dev/null \
          || die 3 "apt-get could not install python3-venv, which $python -m venv needs: install it and run this again"
      fi
      "$python" -m venv "$venv" || die 3 "$python -m venv $venv failed (above): install python3-venv and run this again"
    fi
  fi
  info "installing $requirements into $venv ($what)"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check --require-virtualenv -r "$requirements" \
    || die 3 "pip could not install $requirements (above): check that PyPI is reachable (pip's proxy settings) and run this again"
  echo "$stamp" >"$stamp_file"
fi

if ((plots)); then
  info "done: the plot and report scripts run under $venv/bin/python3 (scripts/report/plot_run.py RUN_DIR)"
  exit 0
fi

# Which nvcc a CUDA build against this torch takes (scripts/lib/cuda-toolkit.sh; setup.sh decides the same way).
read -r torch_version torch_cuda torch_site < <("$venv/bin/python3" -c 'import os, torch; print(torch.__version__, torch.version.cuda or "-", os.path.dirname(os.path.dirname(torch.__file__)))')
info "torch $torch_version (CUDA $torch_cuda) in $venv"
if [[ "$torch_cuda" != "-" ]]; then
  # shellcheck source-path=SCRIPTDIR source=lib/cuda-toolkit.sh
  source scripts/lib/cuda-toolkit.sh
  system_nvcc=""
  while read -r candidate; do
    release="$(nvcc_release "$candidate")"
    if [[ "${release%%.*}" == "${torch_cuda%%.*}" ]]; then system_nvcc="nvcc $release ($candidate)"; break; fi
    [[ -n "$release" ]] && info "nvcc $release ($candidate) is not CUDA ${torch_cuda%%.*}: the CUDA build passes it over"
  done < <(system_nvccs)
  wheels="$(wheel_toolkit "$torch_site" "${torch_cuda%%.*}")"
  if [[ -n "$system_nvcc" ]]; then
    info "the CUDA build takes the system's $system_nvcc${wheels:+; the toolchain wheels in $venv serve where there is none}"
  elif [[ -n "$wheels" ]]; then
    info "the CUDA build takes nvcc $(nvcc_release "$wheels/bin/nvcc") of the toolchain wheels ($wheels/bin/nvcc)"
  else
    info "no nvcc of CUDA ${torch_cuda%%.*} here, nor the toolchain wheels: the CUDA build against this torch needs one; the Python-side tests and scripts do not"
  fi
fi
info "done: 'source $venv/bin/activate', then 'bash scripts/setup.sh' makes the CUDA build against this torch"
