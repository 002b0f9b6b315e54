#pragma once
// What the LibTorch-side wrappers of ltrain's kernels share: torch dtypes as ElementType, the
// current stream, and kernel launch errors as exceptions. CUDA builds only.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ltrain/kernels/element_type.h"

namespace ltrain::kernels {

/// False for dtypes the kernels do not handle.
inline bool element_type_of(torch::ScalarType dtype, ElementType& type) {
  switch (dtype) {
    case torch::kFloat32: type = ElementType::float32; return true;
    case torch::kFloat16: type = ElementType::float16; return true;
    case torch::kBFloat16: type = ElementType::bfloat16; return true;
    default: return false;
  }
}

/// The stream torch enqueues work for `tensor`'s device on (a capturing stream inside a graph).
inline cudaStream_t current_stream_of(const torch::Tensor& tensor) {
  return c10::cuda::getCurrentCUDAStream(tensor.device().index()).stream();
}

/// Whether `tensor`'s data starts on a 16-byte boundary, as the kernels' vector loads need.
inline bool vector_aligned(const torch::Tensor& tensor) {
  return reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 16 == 0;
}

inline void throw_on_error(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(status));
}

}  // namespace ltrain::kernels
