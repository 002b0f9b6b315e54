#pragma once
// A convolution that also returns its output's per-channel sum and sum of squares, so that the
// BatchNorm after it takes its statistics from them instead of reading the output for them
// (ops/batch_norm.h's `statistics`). The forward is ltrain's fused kernel (kernels/fused_conv.h,
// CUTLASS, sm_90a, built with -DLTRAIN_FUSED_CONV=ON); the backward is cuDNN's, through ATen's
// convolution_backward, as torch's own convolution's is.
#include <cstdint>

#include <torch/torch.h>

#include "ltrain/device/limits.h"

namespace ltrain::ops {

/// y = conv2d(x, weight) and its statistics: float32 [2, C_out], row 0 the sum of y over batch and
/// space per channel, row 1 the sum of y^2; not differentiable (BatchNorm's backward accounts for
/// them). Statistics undefined: not computed (y undefined too: conv_with_statistics did not take
/// the convolution).
struct ConvWithStatistics {
  torch::Tensor y;
  torch::Tensor statistics;
};

/// Whether this build has the fused convolutions (configured with -DLTRAIN_FUSED_CONV=ON).
bool fused_conv_built();

/// Whether they run on CUDA `device` (the build has them, and the GPU is compute capability 9.0),
/// and if not, why.
device::KernelFit fused_conv_fit(const torch::Device& device);

/// conv2d(x, weight, stride, padding) without bias, dilation 1 and one group, with its statistics,
/// where the fused kernel takes it and a training step gains by it (kernels/fused_conv.h's
/// fused_conv_pays: 1x1, stride 1, outputs of 32x32 or more): x [B,C,H,W] fp16/bf16 on CUDA,
/// channels_last contiguous; weight [K,C,k,k] of x's dtype and device, channels_last contiguous;
/// both 16-byte aligned. Returns {} (y undefined), having changed nothing, for anything else,
/// while deterministic algorithms are asked for (the BatchNorm after it then runs on cuDNN's or
/// ATen's kernels, which take no statistics), and on a GPU the kernels do not run on (after one
/// warning line, the first time).
ConvWithStatistics conv_with_statistics(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride,
                                        int64_t padding);

}  // namespace ltrain::ops
