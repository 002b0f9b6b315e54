#!/usr/bin/env bash
# Build ltrain on an offline GPU host (Ubuntu, x86-64, pip torch with CUDA, nvcc, cmake, ninja).
# The dependencies that the torch wheel lacks travel as Debian packages in .carry/debs/, and the
# pinned wheels that the host's Python lacks in .carry/wheels/ (both made by scripts/gpu/make-bundle.sh
# where apt and pip work). This script unpacks the packages with `dpkg -x` into a private prefix
# (never into /), installs the wheels into .carry/site/, points CMake at that prefix and at torch,
# and builds with Ninja. It needs no network. A host without nvcc builds with the CUDA toolchain
# wheels the bundle carries (nvcc, CCCL) beside its torch's CUDA runtime.
#
#   scripts/gpu/host-build.sh                        # -> build-gpu/ltrain, build-gpu/tests/...
#   TORCH_PREFIX=/usr/lib/x86_64-linux-gnu/cmake scripts/gpu/host-build.sh --build-dir build-x
#
# About Debian's CMake package files: the only absolute paths in them (spdlog, fmt, GTest,
# cxxopts, nlohmann_json) are in the "/usr move" guard, which compares the REALPATH of the config
# folder with /usr/lib/...; in a private prefix the two differ, so every package computes its
# prefix relative to its own file and nothing needs rewriting. Each <Pkg>_DIR is still set
# explicitly so that a copy elsewhere on the host (or in torch's prefix) can never win.
#
# Exit codes: 0 ok, 2 usage, 3 missing input (bundle, torch), 4 configure failed, 5 build failed.
set -euo pipefail

readonly MULTIARCH="x86_64-linux-gnu"
# package -> its config folder below the prefix's usr/
readonly PKG_DIRS="\
nlohmann_json share/cmake/nlohmann_json
spdlog lib/$MULTIARCH/cmake/spdlog
fmt lib/$MULTIARCH/cmake/fmt
cxxopts lib/cmake/cxxopts
GTest lib/$MULTIARCH/cmake/GTest"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

usage() {
  cat <<EOF
Usage: scripts/gpu/host-build.sh [--build-dir DIR] [--prefix DIR] [--debs DIR] [--torch-prefix DIR]
                                 [--cuda-arch LIST] [--jobs N] [--werror|--no-werror] [--no-tests]
                                 [--configure-only] [--help] [-- EXTRA_CMAKE_ARGS...]

Run from the repo root of ltrain on the GPU host.
  --build-dir DIR     build folder (default: build-gpu)
  --prefix DIR        private prefix for the unpacked .debs (default: .carry/prefix; never /)
  --debs DIR          where the .deb files are (default: .carry/debs)
  --torch-prefix DIR  CMake prefix of LibTorch (default: \$TORCH_PREFIX, else
                      python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  --cuda-arch LIST    CMAKE_CUDA_ARCHITECTURES for ltrain's kernels, e.g. "89-real" or "native" (default:
                      TORCH_CUDA_ARCH_LIST if set, else sm_80, 86, 89, 90, 100, 120 + PTX)
  --jobs N            parallel build jobs (default: all cores)
  --werror            warnings are errors (-DLTRAIN_WERROR=ON; default: \$LTRAIN_WERROR, else OFF)
  --no-werror         warnings stay warnings
  --no-tests          -DLTRAIN_BUILD_TESTS=OFF
  --configure-only    stop after CMake configure
Exit codes: 0 ok, 2 usage, 3 missing bundle/torch, 4 configure failed, 5 build failed.
EOF
}

die() { local code="$1"; shift; echo "host-build: $*" >&2; exit "$code"; }
info() { echo "host-build: $*"; }

# unpack_bundle DEBS PREFIX: dpkg -x every .deb into PREFIX, unless PREFIX already holds exactly
# these .debs (a stamp file lists their SHA-256). Unpacks into a temp folder, then renames.
unpack_bundle() {
  local debs="$1" prefix="$2" stamp deb
  local all=()
  for deb in "$debs"/*.deb; do [[ -f "$deb" ]] && all+=("$deb"); done
  (( ${#all[@]} )) || die 3 "no .deb files in $debs: run scripts/gpu/make-bundle.sh where apt works and carry .carry/debs/ here"
  stamp="$(cd "$debs" && sha256sum -- *.deb)"

  case "$(realpath -m "$prefix")" in
    /|/usr|/usr/local|/opt|"$HOME") die 2 "--prefix $prefix: refusing a system folder; use a private one such as .carry/prefix" ;;
  esac
  if [[ -f "$prefix/.ltrain-prefix" ]] && [[ "$(cat "$prefix/.ltrain-prefix")" == "$stamp" ]]; then
    info "prefix $prefix is up to date (${#all[@]} packages)"
    return 0
  fi
  if [[ -e "$prefix" && ! -f "$prefix/.ltrain-prefix" ]] && [[ -n "$(ls -A "$prefix" 2>/dev/null)" ]]; then
    die 2 "--prefix $prefix exists and was not made by this script; remove it or pick another folder"
  fi

  local tmp="$prefix.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  for deb in "${all[@]}"; do
    info "unpacking $(basename "$deb")"
    dpkg -x "$deb" "$tmp" || { rm -rf "$tmp"; die 3 "dpkg -x failed on $deb (damaged? make the bundle again)"; }
  done
  printf '%s\n' "$stamp" >"$tmp/.ltrain-prefix"
  rm -rf "$prefix"
  mv "$tmp" "$prefix"
  info "unpacked ${#all[@]} packages into $prefix"
}

# install_wheels WHEELS SITE: the carried wheels (make-bundle.sh: the pins this host's Python lacks)
# installed with pip into SITE, a private folder, unless SITE already holds exactly these wheels.
install_wheels() {
  local wheels="$1" site="$2" stamp
  compgen -G "$wheels/*.whl" >/dev/null || return 0
  stamp="$(cd "$wheels" && sha256sum -- *.whl)"
  if [[ -f "$site/.ltrain-wheels" && "$(cat "$site/.ltrain-wheels")" == "$stamp" ]]; then
    info "wheels in $site are up to date"
  else
    local tmp="$site.tmp.$$"
    rm -rf "$tmp"
    if ! PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
           --no-compile --target "$tmp" "$wheels"/*.whl; then
      rm -rf "$tmp"
      die 3 "pip could not install the wheels in $wheels (above): make the bundle again for this host's Python ($(python3 --version 2>&1), make-bundle.sh --python-version)"
    fi
    printf '%s\n' "$stamp" >"$tmp/.ltrain-wheels"
    rm -rf "$site"
    mv "$tmp" "$site"
    info "installed $(cd "$wheels" && ls -- *.whl | paste -sd' ') into $site"
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  info "the Python-side scripts find them with: export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}"
}

# find_torch_prefix: print LibTorch's CMake prefix from $TORCH_PREFIX or the python3 torch.
find_torch_prefix() {
  if [[ -n "${TORCH_PREFIX:-}" ]]; then echo "$TORCH_PREFIX"; return; fi
  command -v python3 >/dev/null || die 3 "python3 not found and TORCH_PREFIX unset: cannot locate LibTorch"
  python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null \
    || die 3 "python3 cannot import torch: install the torch wheel or set TORCH_PREFIX (or --torch-prefix) to LibTorch's CMake prefix"
}

# check_runtime_libs BUILD_DIR PREFIX_LIB: report executables whose shared libraries do not resolve.
check_runtime_libs() {
  local build="$1" libdir="$2" exe missing=0
  while IFS= read -r exe; do
    if ldd "$exe" 2>/dev/null | grep -q 'not found'; then
      echo "host-build: warning: $exe: $(ldd "$exe" | grep 'not found' | awk '{print $1}' | paste -sd' ') not found" >&2
      missing=1
    fi
  done < <(find "$build" -maxdepth 3 -type f -perm -u+x \( -name 'ltrain' -o -name 'ltrain-core' -o -name 'ltrain_*' \) 2>/dev/null)
  if (( missing )); then
    echo "host-build: run with: export LD_LIBRARY_PATH=$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" >&2
  else
    info "all shared libraries resolve (the build RPATH covers $libdir); if you move the binaries:"
    info "  export LD_LIBRARY_PATH=$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
  fi
}

main() {
  local build_dir="$REPO_ROOT/build-gpu" prefix="$REPO_ROOT/.carry/prefix" debs="$REPO_ROOT/.carry/debs"
  local torch_prefix=""
  local cuda_arch="" jobs="" werror="${LTRAIN_WERROR:-OFF}" tests=ON configure_only=0 extra=()
  while (( $# )); do
    case "$1" in
      --help|-h) usage; exit 0 ;;
      --build-dir|--prefix|--debs|--torch-prefix|--cuda-arch|--jobs)
        (( $# >= 2 )) || die 2 "$1 needs a value"
        case "$1" in
          --build-dir) build_dir="$2" ;; --prefix) prefix="$2" ;; --debs) debs="$2" ;;
          --torch-prefix) torch_prefix="$2" ;; --cuda-arch) cuda_arch="$2" ;; --jobs) jobs="$2" ;;
        esac
        shift 2 ;;
      --werror) werror=ON; shift ;;
      --no-werror) werror=OFF; shift ;;
      --no-tests) tests=OFF; shift ;;
      --configure-only) configure_only=1; shift ;;
      --) shift; extra=("$@"); break ;;
      *) die 2 "unknown argument '$1' (see --help)" ;;
    esac
  done
  [[ -z "$jobs" || "$jobs" =~ ^[1-9][0-9]*$ ]] || die 2 "--jobs expects a positive integer, got '$jobs'"
  # Paths given on the command line are relative to where the script was started.
  build_dir="$(realpath -m "$build_dir")"; prefix="$(realpath -m "$prefix")"; debs="$(realpath -m "$debs")"

  cd "$REPO_ROOT"
  [[ "$(uname -m)" == x86_64 ]] || die 3 "the bundle holds amd64 packages; this host is $(uname -m)"
  local tool
  for tool in cmake ninja dpkg sha256sum; do
    command -v "$tool" >/dev/null || die 3 "$tool not found on PATH"
  done

  unpack_bundle "$debs" "$prefix"
  local usr="$prefix/usr"
  install_wheels "$(dirname "$debs")/wheels" "$(dirname "$debs")/site"

  if [[ -n "$torch_prefix" ]]; then TORCH_PREFIX="$torch_prefix"; fi
  torch_prefix="$(find_torch_prefix)"
  [[ -d "$torch_prefix" ]] || die 3 "LibTorch's CMake prefix $torch_prefix does not exist"
  info "LibTorch CMake prefix: $torch_prefix"

  # A CUDA LibTorch needs nvcc: the host's CUDA toolkit (the usual place may be missing from a
  # non-login PATH), else the toolchain wheels the bundle carried (make-bundle.sh), made a toolkit
  # folder with the CUDA runtime's headers beside torch (scripts/lib/cuda-toolkit.sh says why).
  # shellcheck source=../lib/cuda-toolkit.sh
  source "$REPO_ROOT/scripts/lib/cuda-toolkit.sh"
  local cuda_args=() carried torch_site
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  carried="$(compgen -G "$(dirname "$debs")/site/nvidia/cu*/bin/nvcc" | head -n1 || true)"
  if ! command -v nvcc >/dev/null && [[ -n "$carried" ]]; then
    carried="$(dirname "$(dirname "$carried")")"
    torch_site="$(realpath -m "$torch_prefix/../../..")"
    local toolkit="$build_dir/cuda-toolkit"
    cuda_toolkit_view "$toolkit" "$carried" "$torch_site/nvidia/$(basename "$carried")" \
      || die 3 "cannot make the toolkit folder $toolkit"
    [[ -f "$toolkit/include/cuda_runtime.h" ]] \
      || die 3 "the carried toolchain wheels need the CUDA runtime's headers beside torch ($torch_site/nvidia/$(basename "$carried")/include): make the bundle again with --wheel nvidia-cuda-runtime"
    info "nvcc $(nvcc_release "$toolkit/bin/nvcc") of the carried toolchain wheels ($carried/bin/nvcc), as the toolkit folder $toolkit"
    export PATH="$toolkit/bin:$PATH"
    cuda_args=("-DCMAKE_CUDA_COMPILER=$toolkit/bin/nvcc" "-DCUDAToolkit_ROOT=$toolkit" "-DCUDA_TOOLKIT_ROOT_DIR=$toolkit")
  elif command -v nvcc >/dev/null; then
    info "nvcc $(nvcc_release "$(command -v nvcc)") ($(command -v nvcc)), the host's CUDA toolkit"
  fi
  local args=(-S "$REPO_ROOT" -B "$build_dir" -G Ninja "${cuda_args[@]}"
              -DCMAKE_BUILD_TYPE=Release
              "-DCMAKE_PREFIX_PATH=$torch_prefix;$usr;$usr/lib/$MULTIARCH/cmake;$usr/lib/cmake"
              "-DLTRAIN_WERROR=$werror" "-DLTRAIN_BUILD_TESTS=$tests")
  # ltrain's CMakeLists chooses the kernels' architectures (cmake/CudaArchitectures.cmake).
  [[ -n "$cuda_arch" ]] && args+=("-DCMAKE_CUDA_ARCHITECTURES=$cuda_arch")
  local pkg sub
  while read -r pkg sub; do
    [[ -d "$usr/$sub" ]] || die 3 "$pkg's CMake files are missing in the prefix ($usr/$sub): make the bundle again"
    args+=("-D${pkg}_DIR:PATH=$usr/$sub")
  done <<<"$PKG_DIRS"
  info "cmake ${args[*]} ${extra[*]}"
  cmake "${args[@]}" "${extra[@]}" || die 4 "CMake configure failed (see above)"

  info "packages found (from $build_dir/CMakeCache.txt):"
  grep -E '^(nlohmann_json|spdlog|fmt|cxxopts|GTest|Torch)_DIR:' "$build_dir/CMakeCache.txt" | sed 's/^/  /'
  if (( configure_only )); then return 0; fi

  cmake --build "$build_dir" --parallel "${jobs:-$(nproc)}" || die 5 "build failed (see above)"
  check_runtime_libs "$build_dir" "$usr/lib/$MULTIARCH"
  info "done: $build_dir/ltrain"
}

main "$@"
