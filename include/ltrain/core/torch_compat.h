#pragma once
// The one place that knows LibTorch versions apart. Everything else calls these names.
// Supported: Debian's libtorch 1.13 (CPU) and LibTorch 2.x (CPU or CUDA).
#include <string>

#include <utility>
#include <vector>

#include <torch/torch.h>
#include <torch/version.h>

// _fused_sgd_ / _fused_adamw_ with a tensor learning rate arrived in LibTorch 2.2.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define LTRAIN_TORCH_HAS_FUSED_OPTIMIZERS 1
#else
#define LTRAIN_TORCH_HAS_FUSED_OPTIMIZERS 0
#endif

// _foreach_copy_ (one multi-tensor kernel, casting between dtypes on CUDA) arrived in LibTorch 2.1.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define LTRAIN_TORCH_HAS_FOREACH_COPY 1
#else
#define LTRAIN_TORCH_HAS_FOREACH_COPY 0
#endif

// c10d's classes, declared for the process-group functions below (dist/group.cpp includes their headers).
namespace c10d {
class Backend;
class ProcessGroup;
}  // namespace c10d

namespace ltrain::compat {

/// "1.13.0", "2.11.0", ... as LibTorch reports itself.
std::string torch_version();

/// True when ltrain was compiled against a LibTorch with CUDA.
constexpr bool built_with_cuda() { return LTRAIN_WITH_CUDA; }

/// The fewest channels a convolution may have when it runs channels_last on the CPU: the oneDNN
/// backward pass of narrower ones writes past its buffer on AVX2 CPUs (heap corruption, then a
/// crash), seen with Debian's LibTorch 1.13 (oneDNN 2.6.3) and with LibTorch 2.11.
constexpr int64_t min_cpu_channels_last_channels() { return 8; }

/// Number of usable CUDA devices (0 on a CPU build).
int cuda_device_count();

/// The first line of an error message (LibTorch appends backtraces on later lines).
std::string first_line(const std::string& message);

/// True if `error` is LibTorch's out-of-memory error (its type differs between versions).
bool is_out_of_memory(const std::exception& error);

/// What a failed measurement records: "out of memory" for an out-of-memory error, else the
/// message's first line.
std::string failure_summary(const std::exception& error);

/// TF32 tensor-core math for float32 matmuls (cuBLAS) and convolutions (cuDNN).
void set_tf32(bool matmul, bool convolutions);

/// cuDNN autotuning (cudnn.benchmark, timing at most `benchmark_limit` candidate algorithms per
/// convolution, 0: all) and deterministic algorithm choice.
void set_cudnn(bool benchmark, bool deterministic, int benchmark_limit = 10);

// ---- Autocast state per device type (the API changed names in LibTorch 2.4) ----
bool autocast_enabled(torch::DeviceType device_type);
torch::ScalarType autocast_dtype(torch::DeviceType device_type);
void set_autocast(torch::DeviceType device_type, bool enabled, torch::ScalarType dtype);
int autocast_increment_nesting();
/// Returns the nesting depth left.
int autocast_decrement_nesting();
void autocast_clear_cache();
bool autocast_cache_enabled();
void set_autocast_cache_enabled(bool enabled);

// ---- Fused multi-tensor optimizer kernels (LibTorch 2.x, CUDA tensors) ----
/// True when this LibTorch has _fused_sgd_ and _fused_adamw_ with a tensor learning rate.
constexpr bool has_fused_optimizers() { return LTRAIN_TORCH_HAS_FUSED_OPTIMIZERS; }

/// torch.optim.SGD(fused=True)'s kernel over one parameter group (float32 parameters, gradients
/// and buffers, momentum buffers started at zero; `momentum_buffers` empty when momentum is 0).
/// `grad_scale` / `found_inf` may be undefined.
void fused_sgd(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
               const std::vector<torch::Tensor>& momentum_buffers, double weight_decay, double momentum,
               const torch::Tensor& lr, bool nesterov, const torch::Tensor& grad_scale, const torch::Tensor& found_inf);

/// torch.optim.AdamW(fused=True)'s kernel over one parameter group; `steps` already incremented.
void fused_adamw(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                 const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                 const std::vector<torch::Tensor>& steps, const torch::Tensor& lr, double beta1, double beta2,
                 double weight_decay, double eps, const torch::Tensor& grad_scale, const torch::Tensor& found_inf);

/// destinations[i].copy_(sources[i]) for every i, casting to the destinations' dtype: one
/// multi-tensor kernel on CUDA where LibTorch has it (same sizes and strides pairwise), else a copy each.
void foreach_copy(const std::vector<torch::Tensor>& destinations, const std::vector<torch::Tensor>& sources);

/// Only deterministic algorithms (and cuBLAS's deterministic workspace when CUDA is used).
void set_deterministic(bool deterministic);

/// The default CPU generator's state (a uint8 tensor), and setting it back.
torch::Tensor cpu_rng_state();
void set_cpu_rng_state(const torch::Tensor& state);

/// The default generator state of CUDA device `index` (uint8 tensor; undefined on a CPU build),
/// and setting it back.
torch::Tensor cuda_rng_state(int index);
void set_cuda_rng_state(int index, const torch::Tensor& state);

/// Compute capability (major, minor) of CUDA device `index`; (0, 0) on a CPU build.
std::pair<int, int> cuda_capability(int index);

/// Memory of CUDA device `device` in bytes; -1 for the CPU.
int64_t device_total_memory_bytes(const torch::Device& device);

/// Memory of CUDA device `device` this process may use, in bytes: its total, or the limit the
/// last limit_device_memory set; -1 for the CPU.
int64_t device_memory_bytes(const torch::Device& device);

/// Lets LibTorch's caching allocator hold at most `bytes` of CUDA device `device` (its total or
/// more: no limit); beyond that, allocations fail as out of memory. No-op on the CPU.
void limit_device_memory(const torch::Device& device, int64_t bytes);

/// Releases cached device blocks nothing uses and resets the peaks below (no-op on the CPU).
void reset_peak_memory(const torch::Device& device);

/// Bytes allocated to tensors on `device` now; -1 where unknown (the CPU).
int64_t memory_in_use_bytes(const torch::Device& device);

/// Peak bytes allocated to tensors on `device` since the last reset; -1 where unknown (the CPU).
/// A CUDA graph's private pool counts only while its tensors are alive: see peak_reserved_bytes.
int64_t peak_memory_bytes(const torch::Device& device);

/// Peak bytes the caching allocator held on `device` since the last reset (allocated, cached,
/// and CUDA graph pools); -1 where unknown (the CPU).
int64_t peak_reserved_bytes(const torch::Device& device);

/// Starts LibTorch's (Kineto) profiler: host operators, and with `cuda` the CUDA runtime calls and
/// kernels. Throws RunError where this LibTorch was built without it.
void start_profiler(bool cuda);

/// Stops the profiler started by start_profiler and writes its Chrome trace (JSON) to `path`.
void stop_profiler(const std::string& path);

// ---- c10d process groups ----
/// What runs the collectives of one device type (ProcessGroupGloo, ProcessGroupNCCL derive from
/// it): c10d::Backend since LibTorch 2.0, where a c10d::ProcessGroup fronts one per device type;
/// in 1.13 the process group itself.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

/// The orderly end of `backend`, on every rank at the same point (after a barrier): NCCL destroys
/// its communicators once their work is done and stops its threads, so that its destructor has
/// nothing left to abort and does not warn that "destroy_process_group() was not called" (its
/// shutdown() arrived in LibTorch 2.2, the warning in 2.4). Gloo: nothing, its destructor joins
/// its threads.
void shut_down_backend(CollectiveBackend& backend);

/// Ends `backend` at once without the other ranks (one failed, or this one leaves on an error):
/// NCCL aborts its communicators (LibTorch 2.2 on; before, its destructor does). Gloo: nothing.
/// Never throws: it runs on the way out of an error.
void abort_backend(CollectiveBackend& backend) noexcept;

}  // namespace ltrain::compat
