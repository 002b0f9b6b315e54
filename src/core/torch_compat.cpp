#include "ltrain/core/torch_compat.h"

#include <cstring>


namespace ltrain::compat {

std::string torch_version() { return TORCH_VERSION; }

int cuda_device_count() { return built_with_cuda() ? static_cast<int>(torch::cuda::device_count()) : 0; }

bool is_out_of_memory(const std::exception& error) {
  // LibTorch 2.x throws c10::OutOfMemoryError; older releases a c10::Error whose text says so.
  return std::strstr(error.what(), "out of memory") != nullptr ||
         std::strstr(error.what(), "DefaultCPUAllocator: can't allocate memory") != nullptr;
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

}  // namespace ltrain::compat
