#!/usr/bin/env bash
# Download the Debian packages that an offline GPU host needs besides the torch wheel
# (nlohmann-json, spdlog, fmt, cxxopts, GoogleTest) into .carry/debs/. Run it here, where apt
# works; scripts/gpu/host-build.sh unpacks them there into a private prefix.
#
# Exit codes: 0 ok, 2 usage, 1 apt-get failed.
set -euo pipefail

readonly PACKAGES=(nlohmann-json3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
                   libcxxopts-dev libgtest-dev googletest)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

usage() {
  cat <<EOF
Usage: scripts/gpu/make-bundle.sh [--dest DIR] [--help]

Runs 'apt-get download' for: ${PACKAGES[*]}
into DIR (default: $REPO_ROOT/.carry/debs). Packages already there are kept (idempotent).
Then carry .carry/ to the GPU host and run scripts/gpu/host-build.sh there.
EOF
}

die() { local code="$1"; shift; echo "make-bundle: $*" >&2; exit "$code"; }

main() {
  local dest="$REPO_ROOT/.carry/debs"
  while (( $# )); do
    case "$1" in
      --help|-h) usage; exit 0 ;;
      --dest) (( $# >= 2 )) || die 2 "--dest needs a directory"; dest="$2"; shift 2 ;;
      *) die 2 "unknown argument '$1' (see --help)" ;;
    esac
  done
  command -v apt-get >/dev/null || die 1 "apt-get not found: run this on a Debian machine"
  mkdir -p "$dest"

  local pkg missing=()
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
  echo "make-bundle: ${#PACKAGES[@]} packages in $dest ($(du -sh "$dest" | cut -f1)):"
  ls -1 "$dest"
  echo "make-bundle: on the GPU host, from the repo root: scripts/gpu/host-build.sh"
}

main "$@"
