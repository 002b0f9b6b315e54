# shellcheck shell=bash
# The CUDA compiler of a CUDA build, for setup.sh, python-env.sh and gpu/host-build.sh: a system
# toolkit's nvcc of torch's CUDA major version where there is one, else the toolchain that NVIDIA's
# wheels put beside torch (scripts/requirements.txt: cuda-toolkit[nvcc,cccl], which install nvcc,
# ptxas, cicc, the CUDA C++ headers and CCCL into site-packages/nvidia/cu13/, where torch's CUDA
# runtime already is). Sourced, not run; defines functions only.
#
# The wheels' folder is no toolkit CMake can use as it is: its libraries carry only their versioned
# names (libcudart.so.13), which the linker and CMake's FindCUDA do not look for. cuda_toolkit_view
# makes one from it: a folder of symbolic links with the toolkit's layout (bin/, include/, lib64/ with
# the unversioned names, nvvm/). nvcc finds its own files relative to the path it was started by
# (nvcc.profile's $(_HERE_)), so the links' folder is the toolkit's root for nvcc as for CMake.
#
# LTRAIN_NVCC chooses: unset, the search below; "pip", the wheels' toolchain even where a system one
# is, with the system's toolkit hidden from CMake's search (cuda_ignore_args); a path, that nvcc.

# nvcc_release NVCC: its CUDA release, as "13.0"; nothing when it does not answer.
nvcc_release() {
  { "$1" --version 2>/dev/null || true; } | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -n1
}

# system_cuda_roots: the folders a system CUDA toolkit is looked for in and hidden from, one a line:
# CUDA_HOME, CUDA_PATH, /usr/local/cuda and /usr/local/cuda-*, each as given and as the folder it
# links to.
system_cuda_roots() {
  local dir
  for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
    [[ -n "$dir" && -d "$dir" ]] || continue
    echo "$dir"
    [[ "$(realpath "$dir")" == "$dir" ]] || realpath "$dir"
  done | awk '!seen[$0]++'
}

# system_nvccs: the system's nvcc, as the old search found it: the PATH's, else the first of
# CUDA_HOME's, CUDA_PATH's and /usr/local/cuda's (a login shell's PATH may lack the toolkit's bin/).
system_nvccs() {
  local dir
  if command -v nvcc; then return 0; fi
  for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [[ -n "$dir" && -x "$dir/bin/nvcc" ]]; then echo "$dir/bin/nvcc"; return 0; fi
  done
  return 0
}

# wheel_toolkit SITE MAJOR: the nvidia/cuMAJOR folder of SITE (a site-packages folder) where it holds
# nvcc and the CUDA runtime's headers; nothing otherwise.
wheel_toolkit() {
  local dir="$1/nvidia/cu$2"
  [[ -x "$dir/bin/nvcc" && -f "$dir/include/cuda_runtime.h" ]] && echo "$dir"
  return 0
}

# cuda_toolkit_view VIEW WHEELS...: makes VIEW the toolkit folder of links to the files of the WHEELS
# folders (nvidia/cuMAJOR of one site-packages folder or more; the first that has a file gives it),
# unless it is that already. Fails only where the file system does.
cuda_toolkit_view() {
  local view="$1" wheels f name stamp sub
  shift
  stamp="$* $(for wheels in "$@"; do { cd "$wheels" && find bin include lib nvvm -maxdepth 1 2>/dev/null; } || true; done \
              | LC_ALL=C sort | sha256sum | cut -c1-16)"
  if [[ -f "$view/.ltrain-view" && "$(cat "$view/.ltrain-view")" == "$stamp" ]]; then return 0; fi
  local tmp="$view.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp/bin" "$tmp/include" "$tmp/lib64"
  for wheels in "$@"; do
    for sub in bin include; do
      for f in "$wheels/$sub"/*; do
        if [[ -e "$f" && ! -L "$tmp/$sub/$(basename "$f")" ]]; then ln -s "$f" "$tmp/$sub/"; fi
      done
    done
    if [[ -d "$wheels/nvvm" && ! -L "$tmp/nvvm" ]]; then ln -s "$wheels/nvvm" "$tmp/nvvm"; fi
    for f in "$wheels"/lib/*; do
      name="$(basename "$f")"
      [[ -e "$f" && ! -L "$tmp/lib64/$name" ]] || continue
      ln -s "$f" "$tmp/lib64/$name"
      # libcudart.so.13 -> also libcudart.so, the name a link step and find_library look for.
      if [[ "$name" =~ ^(lib.+\.so)\.[0-9.]+$ && ! -e "$wheels/lib/${BASH_REMATCH[1]}" \
            && ! -L "$tmp/lib64/${BASH_REMATCH[1]}" ]]; then
        ln -s "$name" "$tmp/lib64/${BASH_REMATCH[1]}"
      fi
    done
  done
  ln -s lib64 "$tmp/lib"
  echo "$stamp" >"$tmp/.ltrain-view"
  rm -rf "$view"
  mv "$tmp" "$view"
}

# cuda_ignore_args: CMake arguments that hide the system's CUDA toolkit (system_cuda_roots) from
# every find_*() and find_package(): as prefixes, and their bin/, include/ and library folders as
# folders (a HINTS entry that names one is ignored too). Nothing when there is none.
cuda_ignore_args() {
  local roots=() dirs=() root sub
  mapfile -t roots < <(system_cuda_roots)
  ((${#roots[@]})) || return 0
  for root in "${roots[@]}"; do
    for sub in bin include lib lib64 lib64/stubs lib/stubs nvvm/bin targets/x86_64-linux/include \
               targets/x86_64-linux/lib targets/x86_64-linux/lib/stubs; do
      dirs+=("$root/$sub")
    done
  done
  local IFS=';'
  echo "-DCMAKE_IGNORE_PREFIX_PATH=${roots[*]}"
  echo "-DCMAKE_IGNORE_PATH=${dirs[*]}"
}

# path_without_system_cuda: PATH less the system toolkits' bin/ folders.
path_without_system_cuda() {
  local roots=() entry kept=() root hide
  mapfile -t roots < <(system_cuda_roots)
  local IFS=':'
  for entry in $PATH; do
    hide=0
    for root in "${roots[@]}"; do [[ "${entry%/}" == "$root/bin" ]] && hide=1; done
    ((hide)) || kept+=("$entry")
  done
  echo "${kept[*]}"
}
