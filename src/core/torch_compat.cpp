#include "ltrain/core/torch_compat.h"

#include <cstring>

#if LTRAIN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif


namespace ltrain::compat {

std::string torch_version() { return TORCH_VERSION; }

int cuda_device_count() { return built_with_cuda() ? static_cast<int>(torch::cuda::device_count()) : 0; }

std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }

bool is_out_of_memory(const std::exception& error) {
  // LibTorch 2.x throws c10::OutOfMemoryError; older releases a c10::Error whose text says so.
  return std::strstr(error.what(), "out of memory") != nullptr ||
         std::strstr(error.what(), "DefaultCPUAllocator: can't allocate memory") != nullptr;
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

void set_tf32(bool matmul, bool convolutions) {
  at::globalContext().setAllowTF32CuBLAS(matmul);
  at::globalContext().setAllowTF32CuDNN(convolutions);
}

void set_cudnn(bool benchmark, bool deterministic) {
  at::globalContext().setBenchmarkCuDNN(benchmark);
  at::globalContext().setDeterministicCuDNN(deterministic);
}

void reset_peak_memory(const torch::Device& device) {
#if LTRAIN_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#else
  (void)device;
#endif
}

int64_t peak_memory_bytes(const torch::Device& device) {
#if LTRAIN_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    // Entry 0 of a stat array is the aggregate over pool types (the StatType enum's namespace moved in 2.x).
    return stats.allocated_bytes[0].peak;
  }
#else
  (void)device;
#endif
  return -1;
}

}  // namespace ltrain::compat
