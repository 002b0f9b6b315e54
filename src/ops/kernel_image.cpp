#include "ltrain/ops/kernel_image.h"

#if LTRAIN_WITH_CUDA
#include "ltrain/ops/kernel_bridge.h"
#endif

namespace ltrain::ops {

device::KernelFit ltrain_kernel_image_fit(const torch::Device& device) {
#if LTRAIN_WITH_CUDA
  return fit_on(device, kernels::kernel_image_fit);
#else
  (void)device;
  return {false, "a CPU build has no CUDA kernels"};
#endif
}

}  // namespace ltrain::ops
