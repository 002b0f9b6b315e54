#pragma once
// Whether this build carries code for ltrain's own CUDA kernels that a GPU loads: one answer for
// every family of them (they share one architecture list), asked before each family's own fit.
#include <torch/torch.h>

#include "ltrain/device/limits.h"

namespace ltrain::ops {

/// Whether the driver finds (or compiles from PTX) code for ltrain's kernels on CUDA `device`, and
/// if not, why; a CPU build's answer is no.
device::KernelFit ltrain_kernel_image_fit(const torch::Device& device);

}  // namespace ltrain::ops
