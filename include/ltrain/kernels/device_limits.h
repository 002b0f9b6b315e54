#pragma once
// The numbers kernels/device_fit.h decides from, read from the CUDA driver for the current device.
// CUDA builds only (ltrain_kernels).
#include "ltrain/kernels/device_fit.h"

namespace ltrain::kernels {

/// The current device's limits, within LTRAIN_GPU_PROFILE's card where one is set; read once per
/// device. A device the driver cannot describe gives limits of zero (nothing fits).
device::DeviceLimits current_device_limits();

/// What the driver reports of `kernel` (a __global__ function's address) on the current device;
/// loaded is false where the build has no image for it. Leaves no CUDA error behind.
KernelFacts facts_of(const void* kernel);

/// Whether this build carries code the current device can run: all of ltrain's kernels are
/// compiled for one architecture list, so one probe kernel answers for them all.
KernelFit kernel_image_fit();

/// fit_of for `kernels` on the current device, against the architectures this build carries.
KernelFit fit_on_current_device(const std::vector<const void*>& kernels, int threads, Cooperation cooperation);

}  // namespace ltrain::kernels
