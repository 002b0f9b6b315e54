#include "ltrain/core/torch_compat.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>

#include <cstdlib>

#include "ltrain/core/errors.h"

#include <ATen/CPUGeneratorImpl.h>

#if LTRAIN_WITH_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

// ProcessGroupNCCL::shutdown() (its communicators destroyed, its threads stopped) arrived in
// LibTorch 2.2, beside abort(); both take no argument or one with a default in every 2.x since.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define LTRAIN_TORCH_HAS_NCCL_SHUTDOWN 1
#else
#define LTRAIN_TORCH_HAS_NCCL_SHUTDOWN 0
#endif

#if LTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
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

std::string failure_summary(const std::exception& error) {
  return is_out_of_memory(error) ? "out of memory" : first_line(error.what());
}

void set_tf32(bool matmul, bool convolutions) {
  at::globalContext().setAllowTF32CuBLAS(matmul);
  at::globalContext().setAllowTF32CuDNN(convolutions);
}

void set_cudnn(bool benchmark, bool deterministic, int benchmark_limit) {
  at::globalContext().setBenchmarkCuDNN(benchmark);
  at::globalContext().setBenchmarkLimitCuDNN(benchmark_limit);
  at::globalContext().setDeterministicCuDNN(deterministic);
}

// LibTorch 2.4 replaced the per-backend autocast functions with ones taking a device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(torch::DeviceType device_type) { return at::autocast::is_autocast_enabled(device_type); }
torch::ScalarType autocast_dtype(torch::DeviceType device_type) { return at::autocast::get_autocast_dtype(device_type); }
void set_autocast(torch::DeviceType device_type, bool enabled, torch::ScalarType dtype) {
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
}
#else
bool autocast_enabled(torch::DeviceType device_type) {
  return device_type == torch::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
torch::ScalarType autocast_dtype(torch::DeviceType device_type) {
  return device_type == torch::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void set_autocast(torch::DeviceType device_type, bool enabled, torch::ScalarType dtype) {
  if (device_type == torch::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif
int autocast_increment_nesting() { return at::autocast::increment_nesting(); }
int autocast_decrement_nesting() { return at::autocast::decrement_nesting(); }
void autocast_clear_cache() { at::autocast::clear_cache(); }
bool autocast_cache_enabled() { return at::autocast::is_autocast_cache_enabled(); }
void set_autocast_cache_enabled(bool enabled) { at::autocast::set_autocast_cache_enabled(enabled); }

#if LTRAIN_TORCH_HAS_FUSED_OPTIMIZERS
namespace {
c10::optional<torch::Tensor> optional_tensor(const torch::Tensor& tensor) {
  return tensor.defined() ? c10::optional<torch::Tensor>(tensor) : c10::nullopt;
}
}  // namespace

void fused_sgd(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
               const std::vector<torch::Tensor>& momentum_buffers, double weight_decay, double momentum,
               const torch::Tensor& lr, bool nesterov, const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  // The buffers start at zero, so the "first step" branch (copy the gradient) is not needed.
  at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, /*dampening=*/0.0, nesterov,
                  /*maximize=*/false, /*is_first_step=*/false, optional_tensor(grad_scale), optional_tensor(found_inf));
}

void fused_adamw(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                 const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                 const std::vector<torch::Tensor>& steps, const torch::Tensor& lr, double beta1, double beta2,
                 double weight_decay, double eps, const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay,
                    eps, /*amsgrad=*/false, /*maximize=*/false, optional_tensor(grad_scale), optional_tensor(found_inf));
}
#else
void fused_sgd(const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
               double, double, const torch::Tensor&, bool, const torch::Tensor&, const torch::Tensor&) {
  throw std::logic_error("fused_sgd: this LibTorch has no fused optimizer kernels");
}
void fused_adamw(const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
                 const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&, const torch::Tensor&, double,
                 double, double, double, const torch::Tensor&, const torch::Tensor&) {
  throw std::logic_error("fused_adamw: this LibTorch has no fused optimizer kernels");
}
#endif

void foreach_copy(const std::vector<torch::Tensor>& destinations, const std::vector<torch::Tensor>& sources) {
  if (destinations.empty()) return;
#if LTRAIN_TORCH_HAS_FOREACH_COPY
  at::_foreach_copy_(destinations, sources);
#else
  for (size_t i = 0; i < destinations.size(); ++i) destinations[i].copy_(sources[i]);
#endif
}

void set_deterministic(bool deterministic) {
  // cuBLAS is deterministic only with a fixed workspace; the variable must be set before its first use.
  if (deterministic) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(deterministic, /*warn_only=*/false);
}

torch::Tensor cpu_rng_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_cpu_rng_state(const torch::Tensor& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

torch::Tensor cuda_rng_state(int index) {
#if LTRAIN_WITH_CUDA
  at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(index));
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
#else
  (void)index;
  return {};
#endif
}

void set_cuda_rng_state(int index, const torch::Tensor& state) {
#if LTRAIN_WITH_CUDA
  at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(index));
  const std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
#else
  (void)index;
  (void)state;
#endif
}

std::pair<int, int> cuda_capability(int index) {
#if LTRAIN_WITH_CUDA
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(index);
  return {properties->major, properties->minor};
#else
  (void)index;
  return {0, 0};
#endif
}

#if LTRAIN_WITH_CUDA
namespace {
/// The limits limit_device_memory set, per device index.
std::mutex memory_limits_mutex;
std::map<int, int64_t> memory_limits;

c10::DeviceIndex index_of(const torch::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
}  // namespace
#endif

int64_t device_total_memory_bytes(const torch::Device& device) {
#if LTRAIN_WITH_CUDA
  if (device.is_cuda()) return static_cast<int64_t>(at::cuda::getDeviceProperties(index_of(device))->totalGlobalMem);
#else
  (void)device;
#endif
  return -1;
}

int64_t device_memory_bytes(const torch::Device& device) {
#if LTRAIN_WITH_CUDA
  if (device.is_cuda()) {
    const std::lock_guard<std::mutex> lock(memory_limits_mutex);
    const auto limit = memory_limits.find(index_of(device));
    if (limit != memory_limits.end()) return limit->second;
  }
#endif
  return device_total_memory_bytes(device);
}

void limit_device_memory(const torch::Device& device, int64_t bytes) {
#if LTRAIN_WITH_CUDA
  if (!device.is_cuda()) return;
  // LibTorch sets up its allocator for a device with the first tensor there.
  (void)torch::empty({1}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  const int64_t total = device_total_memory_bytes(device);
  const int64_t limit = std::clamp<int64_t>(bytes, 1, total);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(static_cast<double>(limit) / static_cast<double>(total),
                                                     index_of(device));
  const std::lock_guard<std::mutex> lock(memory_limits_mutex);
  memory_limits[index_of(device)] = limit;
#else
  (void)device;
  (void)bytes;
#endif
}

void reset_peak_memory(const torch::Device& device) {
#if LTRAIN_WITH_CUDA
  if (device.is_cuda()) {
    // Cached blocks nothing uses (cuDNN's autotuning workspaces, say) would count as reserved.
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  }
#else
  (void)device;
#endif
}

int64_t memory_in_use_bytes(const torch::Device& device) {
#if LTRAIN_WITH_CUDA
  if (device.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
#else
  (void)device;
#endif
  return -1;
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

int64_t peak_reserved_bytes(const torch::Device& device) {
#if LTRAIN_WITH_CUDA
  if (device.is_cuda()) return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).reserved_bytes[0].peak;
#else
  (void)device;
#endif
  return -1;
}

void start_profiler(bool cuda) {
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  try {
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  } catch (const c10::Error& error) {
    throw RunError(fmt::format("this LibTorch cannot profile ({}); run without --profile",
                               error.what_without_backtrace()));
  }
}

void stop_profiler(const std::string& path) {
  const auto result = torch::autograd::profiler::disableProfiler();
  try {
    result->save(path);
  } catch (const c10::Error& error) {
    // LibTorch builds without Kineto (Debian's) collect events but cannot write a trace.
    throw RunError(fmt::format("cannot write the profile {} ({}); profile with a LibTorch that has Kineto "
                               "(the PyTorch wheel's) or run without --profile",
                               path, error.what_without_backtrace()));
  }
}

#if LTRAIN_WITH_NCCL && LTRAIN_TORCH_HAS_NCCL_SHUTDOWN
void shut_down_backend(CollectiveBackend& backend) {
  if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(&backend)) nccl->shutdown();
}

void abort_backend(CollectiveBackend& backend) noexcept {
  try {
    if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(&backend)) nccl->abort();
  } catch (const std::exception&) {
    // Leaving on an error already: the destructor that follows tears down what is left.
  }
}
#else
void shut_down_backend(CollectiveBackend&) {}
void abort_backend(CollectiveBackend&) noexcept {}
#endif

}  // namespace ltrain::compat
