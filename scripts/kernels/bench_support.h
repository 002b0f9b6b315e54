// What the convolution micro-benchmarks (bench_fused_conv.cu, experiments/conv_graph/bench_conv_graph.cu)
// share: exiting on a CUDA error, and their fp16/bf16 element type with its conversions to and from
// float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ltrain/kernels/element_type.h"

#define CHECK_CUDA(call)                                                                           \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));             \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace ltrain::kernels {

/// The element type of the benchmark's tensors, fp16 or bf16: each benchmark's main sets it
/// (its default, then --dtype).
inline ElementType g_type = ElementType::float16;

/// One fp16/bf16 element of g_type, as its 16 bits, to float.
inline float to_float(uint16_t bits) {
  if (g_type == ElementType::float16) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &word, 4);
  return f;
}

/// float to the 16 bits of g_type, rounded to nearest.
inline uint16_t from_float(float f) {
  if (g_type == ElementType::float16) return static_cast<__half_raw>(__float2half_rn(f)).x;
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(f)).x;
}

}  // namespace ltrain::kernels
