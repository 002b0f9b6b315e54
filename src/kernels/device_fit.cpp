#include "ltrain/kernels/device_fit.h"

#include <algorithm>

#include <fmt/format.h>

#include "ltrain/device/gpu_profile.h"

namespace ltrain::kernels {
namespace {

constexpr int64_t kKiB = 1024;

int64_t ceil_to(int64_t value, int64_t unit) { return (value + unit - 1) / unit * unit; }

}  // namespace

int resident_blocks_per_multiprocessor(const KernelFacts& kernel, int threads, const device::DeviceLimits& limits) {
  if (!kernel.loaded || threads <= 0 || threads > kernel.max_threads_per_block) return 0;
  constexpr int kWarp = 32;
  constexpr int64_t kRegisterUnit = 256;          // registers are allocated per warp in these units
  constexpr int64_t kReservedSharedMemory = kKiB;  // kept by the hardware for each resident block
  const int64_t warps = (threads + kWarp - 1) / kWarp;
  const int64_t registers_per_block =
      warps * ceil_to(static_cast<int64_t>(std::max(kernel.registers_per_thread, 1)) * kWarp, kRegisterUnit);
  const int64_t shared_per_block = kernel.static_shared_memory + kReservedSharedMemory;
  const int64_t blocks = std::min({static_cast<int64_t>(limits.threads_per_multiprocessor) / (warps * kWarp),
                                   static_cast<int64_t>(limits.registers_per_multiprocessor) / registers_per_block,
                                   limits.shared_memory_per_multiprocessor / shared_per_block,
                                   static_cast<int64_t>(limits.blocks_per_multiprocessor)});
  return static_cast<int>(std::max<int64_t>(blocks, 0));
}

KernelFit cluster_fit(const KernelFacts& kernel, const device::DeviceLimits& limits) {
  if (!kernel.loaded) return {false, "the kernel has no image for this GPU"};
  if (limits.capability.major < 9)
    return {false, fmt::format("compute capability {}.{} has no thread-block clusters (9.0 and later have them)",
                               limits.capability.major, limits.capability.minor)};
  if (!limits.cluster_launch)
    return {false, limits.profile.empty() ? std::string("the GPU does not offer cluster launches")
                                          : fmt::format("{}={} plans for a card without them",
                                                        device::kGpuProfileVariable, limits.profile)};
  if (kernel.ptx_version < 90)
    return {false, fmt::format("the code loaded was compiled for compute_{}, which has no cluster instructions "
                               "(build for sm_90 or later)",
                               kernel.ptx_version)};
  return {true, ""};
}

bool takes_clusters(const KernelFacts& kernel, const device::DeviceLimits& limits) {
  return cluster_fit(kernel, limits).runs;
}

KernelFit fit_of(const std::vector<KernelFacts>& kernels, int threads, Cooperation cooperation,
                 const device::DeviceLimits& limits, const std::vector<device::CompiledArchitecture>& built) {
  const device::ComputeCapability gpu = limits.capability;
  for (const KernelFacts& kernel : kernels) {
    if (!kernel.loaded)
      return {false, fmt::format("no kernel image for compute capability {}.{} in this build (it carries {})",
                                 gpu.major, gpu.minor, device::describe_architectures(built))};
    if (resident_blocks_per_multiprocessor(kernel, threads, limits) < 1)
      return {false, fmt::format("a block of {} threads using {} registers each and {} bytes of shared memory does "
                                 "not fit on one multiprocessor",
                                 threads, kernel.registers_per_thread, kernel.static_shared_memory)};
  }
  if (cooperation == Cooperation::grid_or_cluster && !limits.cooperative_launch &&
      std::none_of(kernels.begin(), kernels.end(),
                   [&](const KernelFacts& kernel) { return takes_clusters(kernel, limits); }))
    return {false, "the GPU offers neither cooperative launches nor thread-block clusters"};
  return {true, ""};
}

}  // namespace ltrain::kernels
