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

/// The first line of an error message (LibTorch appends backtraces on later lines).
std::string first_line(const std::string& message);

/// True if `error` is LibTorch's out-of-memory error (its type differs between versions).
bool is_out_of_memory(const std::exception& error);

/// Waits for all work queued on `device` (no-op on the CPU).
void synchronize(const torch::Device& device);

/// TF32 tensor-core math for float32 matmuls (cuBLAS) and convolutions (cuDNN).
void set_tf32(bool matmul, bool convolutions);

/// cuDNN autotuning (cudnn.benchmark) and deterministic algorithm choice.
void set_cudnn(bool benchmark, bool deterministic);

/// Resets the peak of allocated device memory (no-op on the CPU).
void reset_peak_memory(const torch::Device& device);

/// Peak bytes allocated on `device` since the last reset; -1 where unknown (the CPU).
int64_t peak_memory_bytes(const torch::Device& device);

}  // namespace ltrain::compat
