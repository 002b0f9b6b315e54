#include "ltrain/kernels/device_limits.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "ltrain/device/gpu_profile.h"

namespace ltrain::kernels {
namespace {

/// Compiled like every kernel of ltrain, for kernel_image_fit() to ask the driver about; never run.
__global__ void image_probe_kernel() {}

device::DeviceLimits read_limits(int index) {
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  device::DeviceLimits limits;
  limits.capability = {properties.major, properties.minor};
  limits.multiprocessors = properties.multiProcessorCount;
  limits.shared_memory_per_multiprocessor = static_cast<int64_t>(properties.sharedMemPerMultiprocessor);
  limits.registers_per_multiprocessor = properties.regsPerMultiprocessor;
  limits.threads_per_multiprocessor = properties.maxThreadsPerMultiProcessor;
  limits.blocks_per_multiprocessor = properties.maxBlocksPerMultiProcessor;
  limits.cooperative_launch = properties.cooperativeLaunch != 0;
  limits.cluster_launch = properties.clusterLaunch != 0;
  limits.memory_bytes = static_cast<int64_t>(properties.totalGlobalMem);
  const device::GpuProfile* profile = device::active_gpu_profile();
  return profile == nullptr ? limits : device::within_profile(limits, *profile);
}

}  // namespace

device::DeviceLimits current_device_limits() {
  static std::mutex mutex;
  static std::map<int, device::DeviceLimits> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find(device);
  if (found != known.end()) return found->second;
  return known.emplace(device, read_limits(device)).first->second;
}

KernelFacts facts_of(const void* kernel) {
  cudaFuncAttributes attributes{};
  // cudaErrorNoKernelImageForDevice (or cudaErrorInvalidDeviceFunction) where the build carries
  // neither machine code nor PTX this device can use.
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  KernelFacts facts;
  facts.loaded = true;
  facts.ptx_version = attributes.ptxVersion;
  facts.registers_per_thread = attributes.numRegs;
  facts.static_shared_memory = static_cast<int64_t>(attributes.sharedSizeBytes);
  facts.max_threads_per_block = attributes.maxThreadsPerBlock;
  return facts;
}

KernelFit kernel_image_fit() {
  return fit_on_current_device({reinterpret_cast<const void*>(&image_probe_kernel)}, 1, Cooperation::none);
}

KernelFit fit_on_current_device(const std::vector<const void*>& kernels, int threads, Cooperation cooperation) {
  std::vector<KernelFacts> facts;
  facts.reserve(kernels.size());
  for (const void* kernel : kernels) facts.push_back(facts_of(kernel));
  return fit_of(facts, threads, cooperation, current_device_limits(),
                device::parse_architectures(device::built_architectures()));
}

}  // namespace ltrain::kernels
