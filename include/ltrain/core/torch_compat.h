#pragma once
// The one place that knows LibTorch versions apart. Everything else calls these names.
// Supported: Debian's libtorch 1.13 (CPU) and LibTorch 2.x (CPU or CUDA).
#include <string>

#include <torch/torch.h>

namespace ltrain::compat {

/// "1.13.0", "2.11.0", ... as LibTorch reports itself.
std::string torch_version();

/// True when ltrain was compiled against a LibTorch with CUDA.
constexpr bool built_with_cuda() { return LTRAIN_WITH_CUDA; }

/// Number of usable CUDA devices (0 on a CPU build).
int cuda_device_count();

/// True if `error` is LibTorch's out-of-memory error (its type differs between versions).
bool is_out_of_memory(const std::exception& error);

/// Waits for all work queued on `device` (no-op on the CPU).
void synchronize(const torch::Device& device);

}  // namespace ltrain::compat
