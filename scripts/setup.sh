#!/usr/bin/env bash
# Sets up ltrain on a fresh Debian/Ubuntu machine: packages, CIFAR-10, and the build in build/.
# Where a CUDA LibTorch is at hand it builds the CUDA build against it; otherwise the CPU build
# against Debian's libtorch-dev. Idempotent: a second run only rebuilds what changed. It builds
# ltrain (the command and its program); --all builds the tests and tools too (scripts/test.sh).
#
#   bash scripts/setup.sh            # packages + full CIFAR-10 + build/ltrain
#   bash scripts/setup.sh --no-data  # packages + build (+ the small test subset when available)
#   bash scripts/setup.sh --all      # every target: the test binary and ltrain_parity as well
#   bash scripts/setup.sh --cpu      # the CPU build, even where a CUDA LibTorch is at hand
#   bash scripts/setup.sh --check    # which build it would make, and whether its prerequisites hold
#   bash scripts/setup.sh --build-dir DIR   # build in DIR instead of build/
#
# A CUDA LibTorch, first found of: LIBTORCH=DIR (the official LibTorch archive, unpacked), the
# python3 on the PATH with a CUDA torch (pip install torch, or the activated environment that
# scripts/python-env.sh makes), on a machine with an NVIDIA GPU that environment ($LTRAIN_VENV,
# default .venv/) unactivated, a Torch in CMAKE_PREFIX_PATH. Its nvcc (scripts/lib/cuda-toolkit.sh):
# a system CUDA toolkit's of the torch's CUDA major version where there is one (the PATH's, or
# without one there CUDA_HOME's or /usr/local/cuda's; one of another major version is passed over
# with a line), else NVIDIA's toolchain wheels beside that torch (scripts/requirements.txt:
# cuda-toolkit[nvcc,cccl]), made a toolkit folder in BUILD_DIR/cuda-toolkit/; LTRAIN_NVCC=pip takes
# the wheels' even where a system toolkit is and hides that one from the build, LTRAIN_NVCC=PATH
# that nvcc.
# Environment: CMAKE_CUDA_ARCHITECTURES or TORCH_CUDA_ARCH_LIST choose the GPUs the kernels are
# built for (default sm_80, 86, 89, 90, 100, 120 + PTX); LTRAIN_WERROR=ON makes warnings errors.
# Packages come from apt, or on a machine without it (an offline GPU host) from the bundle in
# .carry/debs/ that scripts/gpu/make-bundle.sh makes where apt works.
#
# Exit codes: 0 ok, 2 usage, 3 a prerequisite missing or unusable (the message says what to do),
# 4 configure failed, 5 build failed.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { local code="$1"; shift; echo "setup: $*" >&2; exit "$code"; }
# shellcheck source-path=SCRIPTDIR source=lib/cuda-toolkit.sh
source scripts/lib/cuda-toolkit.sh
info() { echo "setup: $*"; }

want_data=1 force_cpu=0 check_only=0 build_dir=build build_all=0
while (($#)); do
  case "$1" in
    --no-data) want_data=0 ;;
    --all) build_all=1 ;;
    --cpu) force_cpu=1 ;;
    --check) check_only=1 ;;
    --build-dir) (($# >= 2)) && [[ -n "$2" ]] || die 2 "--build-dir needs a folder"; build_dir="$2"; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) die 2 "unknown option $1 (see --help)" ;;
  esac
  shift
done

readonly COMMON_PACKAGES=(build-essential cmake ninja-build nlohmann-json3-dev libspdlog-dev libfmt-dev libcxxopts-dev
                          libgtest-dev xz-utils curl ca-certificates python3 python3-matplotlib)
readonly CPU_PACKAGES=(libtorch-dev libgloo-dev)
# Debian 12's cxxopts (header-only), for distributions whose own is older than 3.0 (Ubuntu 22.04).
readonly CXXOPTS_DEB_URL="https://deb.debian.org/debian/pool/main/c/cxxopts/libcxxopts-dev_3.1.1-1_all.deb"
readonly CXXOPTS_DEB_SHA256="f630f681cf07f5c8438241983ddd27e97fce36a1ef3c7d8b954a88e8de3d8417"

# ---- Which LibTorch -----------------------------------------------------------------------------
# Sets torch_prefix (CMake prefix; "" for Debian's), torch_from, torch_version, torch_cuda ("" for a
# CPU LibTorch), torch_abi (1: the C++11 string ABI), torch_site (a pip torch's site-packages folder,
# where NVIDIA's wheels lie beside it).
torch_prefix="" torch_from="Debian's libtorch-dev" torch_version="" torch_cuda="" torch_abi=1 torch_site=""

find_libtorch_archive() {
  local dir="$LIBTORCH"
  [[ -f "$dir/share/cmake/Torch/TorchConfig.cmake" ]] \
    || die 3 "LIBTORCH=$dir holds no LibTorch (share/cmake/Torch/TorchConfig.cmake is missing): unpack the archive from pytorch.org and point LIBTORCH at its libtorch/ folder"
  torch_prefix="$dir" torch_from="LIBTORCH=$dir"
  local build_version=""
  [[ -f "$dir/build-version" ]] && build_version="$(cat "$dir/build-version")"  # e.g. 2.9.1+cu128
  torch_version="${build_version%%+*}"
  if [[ -f "$dir/lib/libtorch_cuda.so" ]]; then
    [[ "$build_version" =~ \+cu([0-9]+)([0-9])$ ]] && torch_cuda="${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
    [[ -n "$torch_cuda" ]] || torch_cuda="unknown"
  fi
  if grep -q "_GLIBCXX_USE_CXX11_ABI=0" "$dir/share/cmake/Torch/TorchConfig.cmake"; then torch_abi=0; fi
}

# find_python_torch PYTHON: a CUDA torch in that Python.
find_python_torch() {
  local python="$1"
  command -v "$python" >/dev/null || return 1
  local line
  line="$("$python" -c 'import torch; print(torch.__version__.split("+")[0], torch.version.cuda or "-", int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.utils.cmake_prefix_path)' 2>/dev/null)" || return 1
  local version cuda abi prefix
  read -r version cuda abi prefix <<<"$line"
  [[ "$cuda" != "-" ]] || return 1  # a CPU torch: Debian's LibTorch serves the CPU build as well
  torch_prefix="$prefix" torch_from="$(command -v "$python")'s torch" torch_version="$version" torch_cuda="$cuda"
  torch_abi="$abi" torch_site="$(realpath -m "$prefix/../../..")"  # site-packages/torch/share/cmake
}

# The project's own environment (scripts/python-env.sh) serves the CUDA build unasked only where a GPU
# can run it; elsewhere it serves the Python-side tests, and activating it asks for the CUDA build.
has_nvidia_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

# choose_nvcc: the nvcc of a CUDA build (scripts/lib/cuda-toolkit.sh says which). Sets nvcc_bin,
# nvcc_version, nvcc_from (words for the log) and nvcc_wheels (the wheels' nvidia/cuXX folder, which
# the build makes a toolkit folder of; "" for a system toolkit).
nvcc_bin="" nvcc_version="" nvcc_from="" nvcc_wheels=""
choose_nvcc() {
  local major="${torch_cuda%%.*}" candidates=() candidate release passed_over=""
  case "${LTRAIN_NVCC:-}" in
    "") mapfile -t candidates < <(system_nvccs) ;;
    pip) info "LTRAIN_NVCC=pip: the toolchain wheels beside torch, the system's CUDA toolkit hidden from the build" ;;
    *) [[ -x "$LTRAIN_NVCC" && ! -d "$LTRAIN_NVCC" ]] || die 3 "LTRAIN_NVCC=$LTRAIN_NVCC is not an nvcc (no such program)"
       candidates=("$LTRAIN_NVCC") ;;
  esac
  for candidate in "${candidates[@]}"; do
    release="$(nvcc_release "$candidate")"
    if [[ -n "$release" && ( "$torch_cuda" == unknown || "${release%%.*}" == "$major" ) ]]; then
      nvcc_bin="$candidate" nvcc_version="$release" nvcc_from="the system's CUDA toolkit"
      return 0
    fi
    if [[ -z "$release" ]]; then info "$candidate does not answer nvcc --version: passed over"; continue; fi
    info "nvcc $release ($candidate) is CUDA ${release%%.*}, $torch_from is CUDA $torch_cuda: passed over"
    [[ -n "$passed_over" ]] || passed_over="$release $candidate"
  done
  if [[ -n "${LTRAIN_NVCC:-}" && "$LTRAIN_NVCC" != pip ]]; then
    die 3 "LTRAIN_NVCC=$LTRAIN_NVCC is not of CUDA $major.x, which $torch_from needs"
  fi
  [[ -n "$torch_site" ]] && nvcc_wheels="$(wheel_toolkit "$torch_site" "$major")"
  if [[ -n "$nvcc_wheels" ]]; then
    nvcc_bin="$nvcc_wheels/bin/nvcc" nvcc_version="$(nvcc_release "$nvcc_bin")"
    nvcc_from="NVIDIA's toolchain wheels beside torch (nvidia-cuda-nvcc)"
    [[ -n "$nvcc_version" ]] || die 3 "$nvcc_bin does not answer nvcc --version: pip install --force-reinstall 'cuda-toolkit[nvcc,cccl]==$torch_cuda.*' beside torch"
    return 0
  fi
  if compgen -G ".carry/wheels/nvidia_cuda_nvcc-*.whl" >/dev/null; then
    info "no nvcc of CUDA $major here: the bundle's toolchain wheels (.carry/wheels/) serve its build (scripts/gpu/host-build.sh)"
    return 0
  fi
  local wheels_hint="NVIDIA's toolchain wheels beside that torch (pip install 'cuda-toolkit[nvcc,cccl]==$torch_cuda.*'; scripts/python-env.sh installs them into .venv/)"
  [[ "$torch_cuda" == unknown ]] && wheels_hint="the CUDA toolkit of LibTorch's CUDA version"
  if [[ -n "$passed_over" ]]; then
    local release="${passed_over%% *}" candidate="${passed_over#* }"
    die 3 "nvcc $release ($candidate) and $torch_from (CUDA $torch_cuda) differ in CUDA's major version: install the CUDA toolkit $major.x or the torch built for CUDA ${release%%.*} (pip install torch --index-url https://download.pytorch.org/whl/cu${release/./}), or $wheels_hint"
  fi
  die 3 "a CUDA LibTorch (CUDA $torch_cuda) needs nvcc $major.x to build ltrain's kernels, and none is here: $wheels_hint, or the CUDA toolkit $major.x (NVIDIA's apt repository: cuda-toolkit-${torch_cuda/./-}), or build for the CPU with --cpu"
}

if ((!force_cpu)); then
  if [[ -n "${LIBTORCH:-}" ]]; then
    find_libtorch_archive
  elif find_python_torch python3; then
    :
  elif has_nvidia_gpu && find_python_torch "${LTRAIN_VENV:-$PWD/.venv}/bin/python3"; then
    :
  elif [[ -n "${CMAKE_PREFIX_PATH:-}" ]]; then
    torch_from="CMAKE_PREFIX_PATH"
  fi
fi

# ---- What a CUDA build needs before it can configure ---------------------------------------------
if [[ -n "$torch_cuda" ]]; then
  info "CUDA LibTorch $torch_version (CUDA $torch_cuda) from $torch_from"
  [[ "${torch_version%%.*}" =~ ^[0-9]+$ ]] && ((${torch_version%%.*} >= 2)) \
    || die 3 "ltrain's CUDA build needs torch 2.0 or later; $torch_from is $torch_version: pip install -U torch"
  ((torch_abi == 1)) \
    || die 3 "$torch_from $torch_version was built with the pre-C++11 ABI, which cannot link with the system's C++ libraries: install torch 2.7 or later (pip install -U torch) or the cxx11-abi LibTorch archive"
  choose_nvcc
fi
if [[ -n "$nvcc_bin" ]]; then info "nvcc $nvcc_version ($nvcc_bin): $nvcc_from"; fi
if ((check_only)); then
  if [[ -n "$torch_cuda" ]]; then info "would make the CUDA build against $torch_from"
  elif [[ "$torch_from" == CMAKE_PREFIX_PATH ]]; then info "would build against the LibTorch in CMAKE_PREFIX_PATH"
  else info "would make the CPU build against $torch_from"; fi
  exit 0
fi

# ---- Packages -------------------------------------------------------------------------------------
debian_torch=0  # the CPU build against Debian's libtorch-dev
[[ -z "$torch_prefix" && "$torch_from" != CMAKE_PREFIX_PATH ]] && debian_torch=1
packages=("${COMMON_PACKAGES[@]}")
((debian_torch)) && packages+=("${CPU_PACKAGES[@]}")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

get_data() {
  if ((want_data)); then bash scripts/get-cifar10.sh; fi
  # The small real subset for tests, when this checkout sits beside the shared data.
  if [ -d ../shared/data/cifar10-mini ] && [ ! -f data/cifar10-mini/test_batch.bin ]; then
    bash scripts/get-cifar10.sh --mini
  fi
}

bundle_debs=(.carry/debs/*.deb)
if ((${#missing[@]})) && [[ -n "$torch_cuda" && -f "${bundle_debs[0]}" ]]; then
  # An offline GPU host: the carried Debian packages, unpacked into a private prefix.
  info "packages ${missing[*]} are not installed: building from the bundle in .carry/debs"
  get_data
  args=(--build-dir "$build_dir")
  [[ -n "$torch_prefix" ]] && args+=(--torch-prefix "$torch_prefix")
  [[ "${LTRAIN_WERROR:-OFF}" == ON ]] || args+=(--no-werror)
  exec bash scripts/gpu/host-build.sh "${args[@]}"
fi
[[ -z "$torch_cuda" || -n "$nvcc_bin" ]] \
  || die 3 "the bundle's toolchain wheels (.carry/wheels/) serve only the bundle's build, where packages are missing: install them beside torch instead (pip install 'cuda-toolkit[nvcc,cccl]==$torch_cuda.*')"
if ((${#missing[@]})); then
  info "installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  { $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
    || die 3 "apt-get could not install ${missing[*]}: install them, or on a machine without apt access make the bundle elsewhere (bash scripts/gpu/make-bundle.sh) and carry .carry/debs here"
fi

# cxxopts before 3.0 (Ubuntu 22.04 ships 2.2) lacks the API ltrain uses: Debian 12's header-only
# package, checked by its SHA-256, into a private prefix.
cmake_args=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DLTRAIN_WERROR=${LTRAIN_WERROR:-OFF}")
cxxopts_major="$(sed -n 's/^#define CXXOPTS__VERSION_MAJOR \([0-9]*\).*/\1/p' /usr/include/cxxopts.hpp 2>/dev/null | head -n1)"
if [[ -n "$cxxopts_major" ]] && ((cxxopts_major < 3)); then
  prefix=.carry/cxxopts
  if [[ ! -f "$prefix/usr/include/cxxopts.hpp" ]]; then
    info "the system's cxxopts is $cxxopts_major.x; fetching Debian's cxxopts 3.1.1 into $prefix"
    mkdir -p .carry
    curl -fsSL -o .carry/libcxxopts-dev.deb "$CXXOPTS_DEB_URL" || die 3 "cannot download $CXXOPTS_DEB_URL"
    echo "$CXXOPTS_DEB_SHA256  .carry/libcxxopts-dev.deb" | sha256sum -c --quiet \
      || die 3 "$CXXOPTS_DEB_URL does not match its SHA-256"
    dpkg -x .carry/libcxxopts-dev.deb "$prefix"
  fi
  cmake_args+=("-Dcxxopts_DIR=$PWD/$prefix/usr/lib/cmake/cxxopts")
fi

get_data

# ---- Configure and build --------------------------------------------------------------------------
torch_dir=""
if [[ -n "$torch_prefix" ]]; then
  torch_dir="$(dirname "$(find "$torch_prefix" -maxdepth 4 -name TorchConfig.cmake | head -n1)")"
  cmake_args+=("-DCMAKE_PREFIX_PATH=$torch_prefix${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}")
elif ((debian_torch)); then
  torch_dir="/usr/lib/$(gcc -print-multiarch)/cmake/Torch"
fi
[[ -n "$torch_dir" ]] && cmake_args+=("-DTorch_DIR=$torch_dir")
[[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ]] && cmake_args+=("-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES")
mkdir -p "$build_dir"
# The CUDA compiler, and for the wheels' toolchain its toolkit folder (lib/cuda-toolkit.sh says why),
# with the system's toolkit out of the build's sight: off the PATH and hidden from CMake's search.
if [[ -n "$nvcc_wheels" ]]; then
  toolkit="$(realpath -m "$build_dir")/cuda-toolkit"
  cuda_toolkit_view "$toolkit" "$nvcc_wheels" || die 3 "cannot make the toolkit folder $toolkit"
  nvcc_bin="$toolkit/bin/nvcc"
  info "the wheels' toolchain as the CUDA toolkit folder $toolkit"
  PATH="$toolkit/bin:$(path_without_system_cuda)"
  unset CUDA_HOME CUDA_PATH
  mapfile -t ignore_args < <(cuda_ignore_args)
  cmake_args+=("-DCUDAToolkit_ROOT=$toolkit" "-DCUDA_TOOLKIT_ROOT_DIR=$toolkit" "${ignore_args[@]}")
elif [[ -n "$nvcc_bin" ]]; then
  PATH="$(dirname "$nvcc_bin"):$PATH"
fi
[[ -n "$nvcc_bin" ]] && cmake_args+=("-DCMAKE_CUDA_COMPILER=$nvcc_bin")
# A build folder configured against another LibTorch or CUDA compiler starts over: its cache holds
# that one's paths.
cached() { grep -qx "$1:[A-Z]*=$(printf '%s' "$2" | sed 's/[][\.*^$]/\\&/g')" "$build_dir/CMakeCache.txt"; }
if [[ -f "$build_dir/CMakeCache.txt" ]]; then
  if [[ -n "$torch_dir" ]] && ! cached Torch_DIR "$torch_dir"; then
    info "$build_dir/ was configured against another LibTorch: configuring it afresh"
    rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
  elif [[ -n "$nvcc_bin" ]] && grep -q "^CMAKE_CUDA_COMPILER:" "$build_dir/CMakeCache.txt" \
       && ! cached CMAKE_CUDA_COMPILER "$nvcc_bin"; then
    info "$build_dir/ was configured with another nvcc: configuring it afresh"
    rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
  fi
fi
if ! cmake "${cmake_args[@]}" >"$build_dir/configure.log" 2>&1; then
  tail -n 40 "$build_dir/configure.log"
  die 4 "CMake configure failed (above; the whole log is $build_dir/configure.log)"
fi
# What a user should see of the configure step: what ltrain found, and its own warnings (LibTorch's
# CMake files warn about things that do not concern ltrain, such as CMAKE_CUDA_ARCHITECTURES, which
# ltrain's kernels do follow).
grep -E "^-- ltrain: " "$build_dir/configure.log" | sed 's/^-- ltrain: /setup: /'
grep -E -A4 "^CMake Warning at CMakeLists.txt" "$build_dir/configure.log" || true
if ((build_all)); then
  cmake --build "$build_dir" || die 5 "build failed (see above)"
else
  cmake --build "$build_dir" --target ltrain || die 5 "build failed (see above)"
fi
info "done: $build_dir/ltrain --help; $build_dir/ltrain doctor shows what this machine and build offer"
