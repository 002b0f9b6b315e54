#pragma once
// What the operators over ltrain's kernels share: torch dtypes as the kernels' ElementType, the
// current stream, kernel launch errors as exceptions, and whether a family of kernels runs on a
// device. CUDA builds only; included by ops' sources alone, installed with no public header.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ltrain/kernels/device_limits.h"
#include "ltrain/kernels/element_type.h"
#include "ltrain/kernels/gradient_kernels.h"

namespace ltrain::ops {

/// False for dtypes the kernels do not handle.
inline bool element_type_of(torch::ScalarType dtype, kernels::ElementType& type) {
  switch (dtype) {
    case torch::kFloat32: type = kernels::ElementType::float32; return true;
    case torch::kFloat16: type = kernels::ElementType::float16; return true;
    case torch::kBFloat16: type = kernels::ElementType::bfloat16; return true;
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

/// The index of CUDA `device` ("cuda" alone: the current device).
inline c10::DeviceIndex index_of(const torch::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}

/// `fit` (a kernel family's *_fit function) for CUDA `device`, asked once per function and device,
/// with that device current.
inline device::KernelFit fit_on(const torch::Device& device, device::KernelFit (*fit)()) {
  static std::mutex mutex;
  static std::map<std::pair<device::KernelFit (*)(), int>, device::KernelFit> known;
  const c10::DeviceIndex index = index_of(device);
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(fit, static_cast<int>(index));
  const auto found = known.find(key);
  if (found != known.end()) return found->second;
  const c10::cuda::CUDAGuard device_guard(index);
  return known.emplace(key, fit()).first->second;
}

/// fit_on(device, fit).runs; where it is false, one warning line, once per `fit` and device, names
/// the `family` of kernels, the GPU, why, and what runs `instead`.
inline bool warn_unless_fit(const torch::Device& device, device::KernelFit (*fit)(), const char* family,
                            const char* instead) {
  const device::KernelFit verdict = fit_on(device, fit);
  if (verdict.runs) return true;
  static std::mutex mutex;
  static std::map<std::pair<device::KernelFit (*)(), int>, bool> warned;
  const c10::DeviceIndex index = index_of(device);
  const std::lock_guard<std::mutex> lock(mutex);
  if (warned.emplace(std::make_pair(fit, static_cast<int>(index)), true).second) {
    const cudaDeviceProp* gpu = at::cuda::getDeviceProperties(index);
    spdlog::warn("ltrain's {} kernels do not run on cuda:{} ({}, compute capability {}.{}): {}; {} run instead",
                 family, index, gpu->name, gpu->major, gpu->minor, verdict.reason, instead);
  }
  return false;
}

/// Whether the kernels `fit` describes run on CUDA `device`: first whether the build carries code
/// for the GPU at all (one warning for every family where it does not), then `fit` (one warning
/// for this family).
inline bool runs_on(const torch::Device& device, device::KernelFit (*fit)(), const char* family,
                    const char* instead) {
  return warn_unless_fit(device, kernels::kernel_image_fit, "own CUDA", "LibTorch's and cuDNN's kernels") &&
         warn_unless_fit(device, fit, family, instead);
}

/// Whether the gradient kernels (SGD step and inf/NaN check, kernels/gradient_kernels.h) run on CUDA
/// `device`; where they do not, one warning says why and what runs instead.
inline bool gradient_kernels_run_on(const torch::Device& device) {
  return runs_on(device, kernels::gradient_kernels_fit, "SGD and inf/NaN check",
                 "LibTorch's fused SGD and inf/NaN check");
}

/// True when the gradient kernels can read every one of `gradients`: defined, on a GPU they run on,
/// float32, fp16 or bf16, and dense (no gaps, no overlaps).
inline bool gradient_kernels_read(const std::vector<torch::Tensor>& gradients) {
  kernels::ElementType type{};
  for (const torch::Tensor& gradient : gradients) {
    if (!gradient.defined() || !gradient.is_cuda() || !gradient.is_non_overlapping_and_dense()) return false;
    if (!element_type_of(gradient.scalar_type(), type)) return false;
  }
  return gradients.empty() || gradient_kernels_run_on(gradients.front().device());
}

/// A dense gradient as the kernels see it (its dtype one element_type_of knows).
inline kernels::GradientView gradient_view_of(const torch::Tensor& gradient) {
  kernels::GradientView view;
  view.data = gradient.data_ptr();
  view.count = gradient.numel();
  element_type_of(gradient.scalar_type(), view.type);
  return view;
}

}  // namespace ltrain::ops
