#pragma once
// Max pooling as torch::max_pool2d computes it (floor mode, no dilation), forward and backward, on
// the first of two backends that takes the input:
//   ltrain  ltrain's own kernels (kernels/max_pool.h): a one-byte arg-max per output element
//           instead of ATen's int64 index; CUDA, channels_last float32/fp16/bf16 input whose
//           channels fill 16-byte vectors.
//   aten    ATen's operator: takes everything.
#include <torch/torch.h>

#include "ltrain/device/limits.h"

namespace ltrain::ops {

/// Which backends a model's max pooling may run on; ATen's takes what ltrain's does not.
struct MaxPoolBackends {
  /// ltrain's kernels (model.ltrain_max_pool).
  bool ltrain = true;
};

/// torch::max_pool2d(input, kernel, stride, padding) with square windows, on the first backend of
/// `backends` that takes the input; the same values, and gradients summed in float32 in ATen's order.
torch::Tensor max_pool2d(const torch::Tensor& input, int64_t kernel, int64_t stride, int64_t padding,
                         const MaxPoolBackends& backends = {});

/// Whether ltrain's kernels run on CUDA `device` (a CUDA build with an image for it), and if not, why.
device::KernelFit ltrain_max_pool_fit(const torch::Device& device);

/// Whether ltrain's kernels take max_pool2d(input, kernel, stride, padding) (on a GPU they do not
/// run on, after one warning line, the first time: no).
bool takes_ltrain_max_pool(const torch::Tensor& input, int64_t kernel, int64_t stride, int64_t padding);

}  // namespace ltrain::ops
