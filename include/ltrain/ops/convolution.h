#pragma once
// A ResNet's convolution (no bias, dilation 1, the same stride and padding both ways): the one
// entry point through which a model convolves, on the first backend that takes it:
//   ltrain  ltrain's fused convolution with the output's per-channel statistics
//           (ops/fused_conv.h), where they are asked for and it takes the convolution;
//   cudnn   torch's convolution (cuDNN on CUDA), whose backward computes the data gradient and
//           the weight gradient one after the other on one stream; or, with the weight-gradient
//           branch, the same two cuDNN products with the weight gradient on the step's branch
//           stream (core/gpu.h), beside the data gradient and the rest of the backward pass that
//           waits for it.
// Both cuDNN forms run the same kernels on the same inputs: the gradients are bitwise the same.
// An input may carry zero channels past the weight's (images padded for cuDNN's sake,
// padded_image_channels): the weight is extended by zero channels to match.
#include <cstdint>
#include <functional>

#include <torch/torch.h>

#include "ltrain/ops/fused_conv.h"

namespace ltrain::ops {

/// A convolution's geometry: stride and padding (both ways), groups.
struct ConvolutionParameters {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t groups = 1;
};

/// How a model's convolutions run in training, decided once for the model and shared by its layers.
struct ConvolutionBackends {
  /// On CUDA, with autograd recording: each convolution's weight gradient on the step's branch
  /// stream (gpu::fork_to_branch), off the critical path. Whoever runs the backward pass joins
  /// the branch (gpu::join_branch) before reading the weights' gradients.
  bool weight_gradient_branch = false;
  /// With the branch: each weight gradient is joined to the backward pass as soon as it is
  /// queued, because something reads gradients inside the backward pass (the data-parallel
  /// reducer's hooks). It is joined at once anyway where autograd would read it there itself: a
  /// weight that already holds a gradient (autograd adds to it) or is no leaf.
  bool join_each_weight_gradient = false;
  /// With the branch (and not joined at once): called for each weight, on the branch, once its
  /// gradient `grad_weight` is queued there and the data gradient, the backward pass's last reader
  /// of `weight`, is queued on the current stream; what it queues runs after both (the optimizer's
  /// update of that weight, say). `weight` is the tensor the convolution read: a parameter or its
  /// fp16/bf16 copy. Unset: nothing is called.
  using AfterWeightGradient = std::function<void(const torch::Tensor& weight, const torch::Tensor& grad_weight)>;
  AfterWeightGradient after_weight_gradient;
};

/// conv2d(x, weight) with `parameters`, no bias: x [B,C,H,W], weight [K,C/groups,k,k] ->
/// [B,K,H',W']. Under CUDA autocast, x and weight are cast as torch's convolution casts them.
/// With groups 1, x may have more channels than the weight, C' > C: the weight is extended to C'
/// with zero channels (a copy each call, its gradient that of its own C channels), so that x's
/// channels past C add nothing, whatever finite values they hold.
/// `with_statistics`: the output's statistics too, from ltrain's fused convolution where it
/// takes the convolution (ops::conv_with_statistics); statistics undefined otherwise.
ConvWithStatistics convolution(const torch::Tensor& x, const torch::Tensor& weight,
                               const ConvolutionParameters& parameters, const ConvolutionBackends& backends,
                               bool with_statistics = false);

/// The channels to give images of `channels` channels in `dtype` and `format` on `device`, the
/// channels past theirs zero, for a convolution that reads them first (convolution above): where
/// cuDNN's kernels for 3 channels in channels_last pad the input themselves or run slower than
/// for 4 (fp16) or 8 (bf16), those; `channels` elsewhere (docs/benchmarks/small-kernels.md).
int64_t padded_image_channels(int64_t channels, torch::ScalarType dtype, torch::MemoryFormat format,
                              const torch::Device& device);

}  // namespace ltrain::ops
