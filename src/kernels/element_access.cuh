// Loads and stores of ElementType values as float32, and an ElementType's CUDA type chosen at run
// time, for ltrain's kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ltrain/kernels/element_type.h"

namespace ltrain::kernels {

__device__ inline float to_float(float value) { return value; }
__device__ inline float to_float(__half value) { return __half2float(value); }
__device__ inline float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }

template <typename T>
__device__ inline T from_float(float value);
template <>
__device__ inline float from_float<float>(float value) { return value; }
template <>
__device__ inline __half from_float<__half>(float value) { return __float2half_rn(value); }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float value) { return __float2bfloat16_rn(value); }

/// f(T()) with T the CUDA type of `type` (float, __half or __nv_bfloat16): a launcher templated on
/// the element type, chosen at run time. cudaErrorInvalidValue for a type outside the enumeration.
template <typename F>
cudaError_t with_element_type(ElementType type, F&& f) {
  switch (type) {
    case ElementType::float32: return f(float());
    case ElementType::float16: return f(__half());
    case ElementType::bfloat16: return f(__nv_bfloat16());
  }
  return cudaErrorInvalidValue;
}

__device__ inline int64_t first_thread() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ inline int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace ltrain::kernels
