# cmake -P tests/cuda_architectures_test.cmake: the architecture choice of cmake/CudaArchitectures.cmake.
cmake_minimum_required(VERSION 3.18)
include("${CMAKE_CURRENT_LIST_DIR}/../cmake/CudaArchitectures.cmake")

set(failures 0)
function(expect what actual expected)
  if(NOT "${actual}" STREQUAL "${expected}")
    message(SEVERE_WARNING "${what}: got \"${actual}\", expected \"${expected}\"")
    math(EXPR count "${failures} + 1")
    set(failures ${count} PARENT_SCOPE)
  endif()
endfunction()

# What nvcc 13.0 and 12.4 list (--list-gpu-code).
set(nvcc_13_0 sm_75 sm_80 sm_86 sm_87 sm_88 sm_89 sm_90 sm_100 sm_110 sm_103 sm_120 sm_121)
set(nvcc_12_4 sm_50 sm_52 sm_53 sm_60 sm_61 sm_62 sm_70 sm_72 sm_75 sm_80 sm_86 sm_87 sm_89 sm_90)

ltrain_default_cuda_architectures(result "${nvcc_13_0}")
expect("default, nvcc 13.0" "${result}" "80-real;86-real;89-real;90-real;100-real;120")
ltrain_default_cuda_architectures(result "${nvcc_12_4}")
expect("default, nvcc 12.4 (no Blackwell): PTX for sm_90" "${result}" "80-real;86-real;89-real;90")
ltrain_default_cuda_architectures(result "sm_50;sm_60")
expect("default, a compiler with none of them" "${result}" "")

ltrain_cuda_architectures_from_torch_list(result error "8.6")
expect("TORCH_CUDA_ARCH_LIST 8.6" "${result};${error}" "86-real;")
ltrain_cuda_architectures_from_torch_list(result error "8.9 9.0+PTX")
expect("TORCH_CUDA_ARCH_LIST with spaces and +PTX" "${result};${error}" "89-real;90;")
ltrain_cuda_architectures_from_torch_list(result error "9.0a;10.0f+PTX")
expect("TORCH_CUDA_ARCH_LIST with a and f variants" "${result}" "90a-real;100f")
ltrain_cuda_architectures_from_torch_list(result error "8.9;Ampere")
expect("TORCH_CUDA_ARCH_LIST with a name" "${result}" "")
expect("TORCH_CUDA_ARCH_LIST error text" "${error}"
       "TORCH_CUDA_ARCH_LIST entry \"Ampere\" is not a compute capability such as 8.9 or 9.0+PTX")

ltrain_cuda_architectures_of_gpus(result "8.9;8.9; 12.0")
expect("native: one entry per kind of GPU" "${result}" "89-real;120-real")

ltrain_choose_cuda_architectures(result source "" "" "${nvcc_13_0}" "")
expect("choose: default" "${result}|${source}" "80-real;86-real;89-real;90-real;100-real;120|default")
ltrain_choose_cuda_architectures(result source "" "8.0+PTX" "${nvcc_13_0}" "")
expect("choose: TORCH_CUDA_ARCH_LIST when no CMAKE_CUDA_ARCHITECTURES" "${result}|${source}" "80|TORCH_CUDA_ARCH_LIST")
ltrain_choose_cuda_architectures(result source "89-real" "8.0+PTX" "${nvcc_13_0}" "")
expect("choose: CMAKE_CUDA_ARCHITECTURES first" "${result}|${source}" "89-real|CMAKE_CUDA_ARCHITECTURES")
ltrain_choose_cuda_architectures(result source "native" "" "${nvcc_13_0}" "9.0")
expect("choose: native" "${result}|${source}" "90-real|native")
ltrain_choose_cuda_architectures(result source "native" "" "${nvcc_13_0}" "")
expect("choose: native without a GPU" "${result}|${source}"
       "|error: CMAKE_CUDA_ARCHITECTURES=native, but nvidia-smi reports no GPU; name the architectures (e.g. 89 for an RTX 4090)")
ltrain_choose_cuda_architectures(result source "" "" "sm_50" "")
expect("choose: no default the compiler supports" "${result}|${source}"
       "|error: this nvcc supports none of sm_80, sm_86, sm_89, sm_90, sm_100, sm_120; use a CUDA toolkit of 11.8 or later")

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} expectation(s) failed")
endif()
message(STATUS "cuda architectures: all expectations hold")
