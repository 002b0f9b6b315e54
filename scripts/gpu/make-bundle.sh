#!/usr/bin/env bash
# Makes the bundle an offline GPU host builds from, here where apt and pip work:
#   - the Debian packages it needs besides the torch wheel (nlohmann-json, spdlog, fmt, cxxopts,
#     GoogleTest) into .carry/debs/; scripts/gpu/host-build.sh unpacks them there into a private prefix;
#   - the pinned wheels (scripts/requirements.txt) that its Python lacks, for its Python version and
#     platform, into .carry/wheels/; host-build.sh installs them there into .carry/site/. By default
#     those are the CUDA toolchain's (nvcc, CCCL, the compiler's headers and cicc: what
#     cuda-toolkit[nvcc,cccl] installs beside torch's CUDA runtime), with which host-build.sh builds
#     on a host that has the NVIDIA driver and a CUDA torch but no CUDA toolkit.
#
# Exit codes: 0 ok, 2 usage, 1 apt-get or pip failed.
set -euo pipefail

readonly PACKAGES=(nlohmann-json3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
                   libcxxopts-dev libgtest-dev googletest)
# The pins that a GPU host with the driver and torch 2.11.0+cu130 but no CUDA toolkit lacks (the
# reference host's image, Python 3.12, has torchvision, safetensors, tensorboard, numpy, matplotlib),
# by name; their versions are requirements.txt's. --wheel NAME carries those named instead.
readonly HOST_WHEELS=(nvidia-cuda-nvcc nvidia-cuda-cccl nvidia-cuda-crt nvidia-nvvm)
readonly HOST_PYTHON_VERSION=3.12
# manylinux tags that an x86-64 host with glibc 2.39 (Ubuntu 24.04) installs, newest first: pip
# download matches a tag exactly.
readonly HOST_PLATFORMS=(manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64
                         manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
                         manylinux2014_x86_64 manylinux1_x86_64)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

usage() {
  cat <<USAGE
Usage: scripts/gpu/make-bundle.sh [--dest DIR] [--wheel NAME]... [--python-version X.Y] [--wheels-only] [--help]

Runs 'apt-get download' for: ${PACKAGES[*]}
into DIR/debs (default DIR: $REPO_ROOT/.carry), and 'pip download' of the wheels the GPU host lacks
(${HOST_WHEELS[*]}: the CUDA toolchain; or, given --wheel NAME, each package so named that
scripts/requirements.txt pins)
for Python $HOST_PYTHON_VERSION (--python-version) into DIR/wheels. What is already there is kept.
Then carry .carry/ to the GPU host and run scripts/gpu/host-build.sh there.
  --wheels-only   the wheels alone, no Debian packages
USAGE
}

die() { local code="$1"; shift; echo "make-bundle: $*" >&2; exit "$code"; }

# normalized_name NAME: NAME as pip compares names (lower case, runs of -, _ and . as one -).
normalized_name() { echo "$1" | tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/-/g; s/[[:space:]]//g'; }

# pinned_version NAME: the version scripts/requirements.txt pins NAME to; fails when it pins none.
pinned_version() {
  local wanted line
  wanted="$(normalized_name "$1")"
  while IFS= read -r line; do
    line="${line%%#*}"
    [[ "$line" == *"=="* ]] || continue
    if [[ "$(normalized_name "${line%%==*}")" == "$wanted" ]]; then
      echo "${line##*==}" | tr -d '[:space:]'
      return 0
    fi
  done <"$REPO_ROOT/scripts/requirements.txt"
  return 1
}

download_debs() {
  local dest="$1" pkg missing=()
  command -v apt-get >/dev/null || die 1 "apt-get not found: run this on a Debian machine (or pass --wheels-only)"
  mkdir -p "$dest"
  for pkg in "${PACKAGES[@]}"; do
    # apt-get download names files <name>_<version>_<arch>.deb (the version's ':' as %3a).
    if compgen -G "$dest/${pkg}_*.deb" >/dev/null; then
      echo "make-bundle: have $(basename "$(compgen -G "$dest/${pkg}_*.deb" | head -n1)")"
    else
      missing+=("$pkg")
    fi
  done
  if (( ${#missing[@]} )); then
    echo "make-bundle: downloading ${missing[*]}"
    # apt-get download writes into the current directory; it runs unprivileged as _apt when it can.
    (cd "$dest" && apt-get download "${missing[@]}") \
      || die 1 "apt-get download failed (run 'apt-get update' first?)"
  fi
  for pkg in "${PACKAGES[@]}"; do
    compgen -G "$dest/${pkg}_*.deb" >/dev/null || die 1 "$pkg is still missing in $dest"
  done
  echo "make-bundle: ${#PACKAGES[@]} packages in $dest ($(du -sh "$dest" | cut -f1))"
}

# download_wheels DEST PYTHON_VERSION NAME...: each NAME at its pinned version, for the host.
download_wheels() {
  local dest="$1" python_version="$2"
  shift 2
  if (( $# == 0 )); then
    echo "make-bundle: no wheels to carry: the GPU host's image has every pin"
    return 0
  fi
  local name version platform platform_args=() pins=()
  for name in "$@"; do
    version="$(pinned_version "$name")" || die 2 "$name is not pinned in scripts/requirements.txt: pin it there first"
    pins+=("$name==$version")
  done
  for platform in "${HOST_PLATFORMS[@]}"; do platform_args+=(--platform "$platform"); done
  mkdir -p "$dest"
  echo "make-bundle: downloading ${pins[*]} for Python $python_version"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version "$python_version" --implementation cp "${platform_args[@]}" -d "$dest" "${pins[@]}" \
    || die 1 "pip download of ${pins[*]} failed (above)"
  echo "make-bundle: wheels in $dest ($(du -sh "$dest" | cut -f1)):"
  ls -1 "$dest"
}

main() {
  local dest="$REPO_ROOT/.carry" python_version="$HOST_PYTHON_VERSION" wheels_only=0
  local wheels=()
  while (( $# )); do
    case "$1" in
      --help|-h) usage; exit 0 ;;
      --dest) (( $# >= 2 )) || die 2 "--dest needs a directory"; dest="$2"; shift 2 ;;
      --wheel) (( $# >= 2 )) || die 2 "--wheel needs a package name"; wheels+=("$2"); shift 2 ;;
      --python-version)
        (( $# >= 2 )) && [[ "$2" =~ ^3\.[0-9]+$ ]] || die 2 "--python-version expects X.Y, such as 3.12"
        python_version="$2"; shift 2 ;;
      --wheels-only) wheels_only=1; shift ;;
      *) die 2 "unknown argument '$1' (see --help)" ;;
    esac
  done
  (( ${#wheels[@]} )) || wheels=("${HOST_WHEELS[@]}")
  (( wheels_only )) || download_debs "$dest/debs"
  download_wheels "$dest/wheels" "$python_version" "${wheels[@]}"
  echo "make-bundle: on the GPU host, from the repo root: scripts/gpu/host-build.sh"
}

main "$@"
