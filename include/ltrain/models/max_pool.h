#pragma once
// Max pooling as torch::max_pool2d computes it (floor mode, no dilation), forward and backward.
// On CUDA, for channels_last float32/float16/bfloat16 input whose channels fill 16-byte vectors,
// it runs ltrain's own kernels (kernels/max_pool_nhwc.h: a one-byte arg-max per output element
// instead of ATen's int64 index); elsewhere, and with `own_kernels` false, ATen's operator.
#include <torch/torch.h>

#include "ltrain/kernels/device_fit.h"

namespace ltrain::models {

/// Whether the kernels run on CUDA `device` (a CUDA build with an image for it), and if not, why.
kernels::KernelFit own_max_pool_fit(const torch::Device& device);

/// Whether max_pool2d(input, kernel, stride, padding, true) would run ltrain's kernels (on a GPU
/// they do not run on, after one warning line, the first time: no).
bool takes_own_max_pool(const torch::Tensor& input, int64_t kernel, int64_t stride, int64_t padding);

/// torch::max_pool2d(input, kernel, stride, padding) with square windows; the same values, and
/// gradients summed in float32 in ATen's order.
torch::Tensor max_pool2d(const torch::Tensor& input, int64_t kernel, int64_t stride, int64_t padding,
                         bool own_kernels = true);

}  // namespace ltrain::models
