#!/usr/bin/env bash
# Makes ltrain's Python environment: a virtual environment (.venv/ by default) holding the versions
# pinned in scripts/requirements.txt: a CUDA torch from PyPI (the CUDA build's LibTorch), torchvision,
# safetensors, tensorboard, numpy and matplotlib (the PyTorch-side tests and the report scripts).
# Idempotent: a second run with the same pins only checks the environment.
#
#   bash scripts/python-env.sh                 # -> .venv/ (or $LTRAIN_VENV)
#   bash scripts/python-env.sh --venv DIR      # another folder
#   source .venv/bin/activate && bash scripts/setup.sh   # then: the CUDA build against its torch
#
# Environment: PYTHON (default python3) makes the environment; pip's own cache and settings apply.
# Exit codes: 0 ok, 2 usage, 3 a prerequisite missing or a download failed (the message says what to do).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { local code="$1"; shift; echo "python-env: $*" >&2; exit "$code"; }
info() { echo "python-env: $*"; }

venv="${LTRAIN_VENV:-.venv}"
while (($#)); do
  case "$1" in
    --venv) (($# >= 2)) || die 2 "--venv needs a folder"; venv="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) die 2 "unknown option $1 (see --help)" ;;
  esac
done
readonly requirements=scripts/requirements.txt
python="${PYTHON:-python3}"
command -v "$python" >/dev/null || die 3 "$python not found: install Python 3.10 or later (apt-get install python3 python3-venv)"

# The pins' checksum, kept in the environment: the same one means nothing to install.
stamp_file="$venv/.ltrain-requirements"
stamp="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python3" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]] \
   && "$venv/bin/python3" -c 'import torch' 2>/dev/null; then
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
  info "installing $requirements into $venv (torch and its CUDA libraries: about 5 GB, pip's cache keeps the downloads)"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check --require-virtualenv -r "$requirements" \
    || die 3 "pip could not install $requirements (above): check that PyPI is reachable (pip's proxy settings) and run this again"
  echo "$stamp" >"$stamp_file"
fi

# What a CUDA build against this torch will need: the toolkit of its CUDA major version.
read -r torch_version torch_cuda < <("$venv/bin/python3" -c 'import torch; print(torch.__version__, torch.version.cuda or "-")')
info "torch $torch_version (CUDA $torch_cuda) in $venv"
if [[ "$torch_cuda" != "-" ]]; then
  nvcc_bin="$(command -v nvcc || true)"
  [[ -z "$nvcc_bin" && -x /usr/local/cuda/bin/nvcc ]] && nvcc_bin=/usr/local/cuda/bin/nvcc
  if [[ -z "$nvcc_bin" ]]; then
    info "no nvcc found: the CUDA build against this torch needs the CUDA toolkit ${torch_cuda%%.*}.x; the Python-side tests and scripts do not"
  else
    nvcc_version="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')"
    if [[ "${nvcc_version%%.*}" != "${torch_cuda%%.*}" ]]; then
      info "nvcc $nvcc_version ($nvcc_bin) is not CUDA ${torch_cuda%%.*}.x: the CUDA build against this torch needs the CUDA toolkit ${torch_cuda%%.*}.x; the Python-side tests and scripts do not"
    else
      info "nvcc $nvcc_version ($nvcc_bin) matches"
    fi
  fi
fi
info "done: 'source $venv/bin/activate', then 'bash scripts/setup.sh' makes the CUDA build against this torch"
