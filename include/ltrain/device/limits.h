#pragma once
// What a GPU offers ltrain's kernels, as plain numbers: its compute capability and the limits a
// kernel plans with. The CUDA side (kernels/device_limits.h) reads them from the driver; a GPU
// profile (device/gpu_profile.h) narrows them to a smaller card's.
#include <cstdint>
#include <string>

namespace ltrain::device {

/// A GPU's compute capability, e.g. {8, 9} for an RTX 4090.
struct ComputeCapability {
  int major = 0;
  int minor = 0;
  /// 89 for {8, 9}: the number in sm_89.
  int code() const { return major * 10 + minor; }
};

/// What ltrain's kernels may count on from a GPU.
struct DeviceLimits {
  ComputeCapability capability;
  int multiprocessors = 0;
  int64_t shared_memory_per_multiprocessor = 0;  ///< bytes
  int registers_per_multiprocessor = 0;
  int threads_per_multiprocessor = 0;
  int blocks_per_multiprocessor = 0;
  bool cooperative_launch = false;
  bool cluster_launch = false;  ///< thread-block clusters (compute capability 9.0 and later)
  int64_t memory_bytes = 0;
  std::string profile;  ///< the GpuProfile these limits were narrowed to (within_profile); "" for none
};

/// Whether something of ltrain's runs on a device (a family of its kernels, a fused path), and if
/// not, why (a phrase for a one-line warning).
struct KernelFit {
  bool runs = false;
  std::string reason;
};

}  // namespace ltrain::device
