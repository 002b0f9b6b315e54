# The GPU architectures ltrain's own CUDA kernels are compiled for, chosen apart from LibTorch's
# CMake files (which switch CMAKE_CUDA_ARCHITECTURES off and add their own -gencode flags).
# Plain functions of their arguments, so that tests/cuda_architectures_test.cmake can check them
# with `cmake -P`.

# Machine code by default for Ampere (A100 8.0, RTX 30 8.6), Ada (RTX 40 8.9), Hopper (H100/H200
# 9.0) and Blackwell (B200 10.0, RTX 50 12.0), where the compiler supports them; PTX for the newest,
# which the driver compiles for any later GPU.
set(LTRAIN_DEFAULT_CUDA_CODES 80 86 89 90 100 120)

# ltrain_default_cuda_architectures(<out> <supported>): the default codes found in <supported> (the
# sm_XY list `nvcc --list-gpu-code` prints) as a CUDA_ARCHITECTURES list, "80-real;...;120"
# (an entry without -real carries PTX too). Empty when the compiler supports none of them.
function(ltrain_default_cuda_architectures out supported)
  set(codes "")
  foreach(code IN LISTS LTRAIN_DEFAULT_CUDA_CODES)
    if("sm_${code}" IN_LIST supported)
      list(APPEND codes ${code})
    endif()
  endforeach()
  if(codes)
    list(POP_BACK codes newest)
    list(TRANSFORM codes APPEND "-real")
    list(APPEND codes ${newest})
  endif()
  set(${out} "${codes}" PARENT_SCOPE)
endfunction()

# ltrain_cuda_architectures_from_torch_list(<out> <error> <list>): TORCH_CUDA_ARCH_LIST's spelling
# ("8.6", "8.9 9.0+PTX", "9.0a;10.0") as CUDA_ARCHITECTURES ("86-real", "89-real;90", ...). Sets
# <error> to a sentence naming the first entry it cannot read, else to "".
function(ltrain_cuda_architectures_from_torch_list out error list)
  string(REPLACE " " ";" entries "${list}")
  set(result "")
  foreach(entry IN LISTS entries)
    if(entry STREQUAL "")
      continue()
    endif()
    if(NOT entry MATCHES "^([0-9]+)\\.([0-9])([af]?)(\\+PTX)?$")
      set(${out} "" PARENT_SCOPE)
      set(${error} "TORCH_CUDA_ARCH_LIST entry \"${entry}\" is not a compute capability such as 8.9 or 9.0+PTX"
          PARENT_SCOPE)
      return()
    endif()
    set(code "${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
    if(CMAKE_MATCH_4)
      list(APPEND result "${code}")
    else()
      list(APPEND result "${code}-real")
    endif()
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
  set(${error} "" PARENT_SCOPE)
endfunction()

# ltrain_cuda_architectures_of_gpus(<out> <capabilities>): machine code for each GPU present, from
# `nvidia-smi --query-gpu=compute_cap` lines ("8.9", "9.0"), without repeats.
function(ltrain_cuda_architectures_of_gpus out capabilities)
  set(result "")
  foreach(capability IN LISTS capabilities)
    string(STRIP "${capability}" capability)
    if(capability MATCHES "^([0-9]+)\\.([0-9])$")
      list(APPEND result "${CMAKE_MATCH_1}${CMAKE_MATCH_2}-real")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES result)
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

# ltrain_choose_cuda_architectures(<out> <source> <requested> <torch_list> <supported> <gpus>): the
# first that applies of <requested> (CMAKE_CUDA_ARCHITECTURES as the user gave it; "native" means
# the GPUs in <gpus>), <torch_list> (TORCH_CUDA_ARCH_LIST) and the default over <supported>. Sets
# <source> to what decided it: "CMAKE_CUDA_ARCHITECTURES", "TORCH_CUDA_ARCH_LIST", "native" or
# "default"; on a list it cannot use, <out> is "" and <source> an error sentence starting "error:".
function(ltrain_choose_cuda_architectures out source requested torch_list supported gpus)
  set(result "")
  if(requested STREQUAL "native")
    ltrain_cuda_architectures_of_gpus(result "${gpus}")
    set(decided "native")
    if(NOT result)
      set(decided "error: CMAKE_CUDA_ARCHITECTURES=native, but nvidia-smi reports no GPU; name the architectures \
(e.g. 89 for an RTX 4090)")
    endif()
  elseif(requested)
    set(result "${requested}")
    set(decided "CMAKE_CUDA_ARCHITECTURES")
  elseif(torch_list)
    ltrain_cuda_architectures_from_torch_list(result error "${torch_list}")
    set(decided "TORCH_CUDA_ARCH_LIST")
    if(error)
      set(decided "error: ${error}")
    endif()
  else()
    ltrain_default_cuda_architectures(result "${supported}")
    set(decided "default")
    if(NOT result)
      list(JOIN LTRAIN_DEFAULT_CUDA_CODES ", sm_" wanted)
      set(decided "error: this nvcc supports none of sm_${wanted}; use a CUDA toolkit of 11.8 or later")
    endif()
  endif()
  set(${out} "${result}" PARENT_SCOPE)
  set(${source} "${decided}" PARENT_SCOPE)
endfunction()
