#pragma once
// Training-mode BatchNorm fused with the ReLU (and the residual add) that follows it in a ResNet:
// y = relu(batch_norm(x) + residual), one cuDNN kernel forward and one backward
// (cudnnBatchNormalizationForwardTrainingEx / BackwardEx with the BN_ACTIVATION and
// BN_ADD_ACTIVATION ops, NHWC persistent mode) instead of BatchNorm, add and ReLU kernels and
// their autograd nodes. Same numbers as the three operators to rounding: the sum and the ReLU are
// taken in float32 before the single rounding to fp16/bf16.
#include <torch/torch.h>

namespace ltrain::models {

/// Whether this build has the fused kernels (a CUDA build that found cuDNN at configure time).
bool fused_batchnorm_built();

/// What the fused kernel takes: training-mode statistics with momentum and eps as
/// torch.nn.BatchNorm2d's; weight/bias/running statistics float32 [C].
struct BatchNormParameters {
  torch::Tensor weight, bias, running_mean, running_var;
  double momentum;
  double eps;
};

/// Whether the inputs have the form both fused paths (this one and models/own_batchnorm.h) need:
/// x [B,C,H,W] fp16 or bf16 on CUDA, channels_last contiguous, not empty; residual undefined or of
/// x's shape, dtype, device and layout; weight, bias and running statistics float32 [C] on x's device.
bool takes_half_nhwc_batchnorm(const torch::Tensor& x, const torch::Tensor& residual,
                               const BatchNormParameters& parameters);

/// relu(batch_norm(x) + residual) with batch statistics, updating the running statistics in place,
/// differentiable in x, residual, weight and bias. x: [B,C,H,W] fp16 or bf16 on CUDA, channels_last
/// contiguous, C a multiple of 4; residual: undefined (no add) or x's shape, dtype and layout.
/// Returns an undefined tensor, having changed nothing, when the inputs or this cuDNN cannot take
/// the fused path (the caller then runs the three operators); remembers a cuDNN refusal per dtype
/// and op, so later calls fall back without asking again.
torch::Tensor try_fused_batchnorm_relu(const torch::Tensor& x, const torch::Tensor& residual,
                                       const BatchNormParameters& parameters);

}  // namespace ltrain::models
