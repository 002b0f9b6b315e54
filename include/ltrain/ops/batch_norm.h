#pragma once
// BatchNorm as a ResNet uses it: y = batch_norm(x), relu(batch_norm(x)) or
// relu(batch_norm(x) + residual), in training on the first of three backends that takes the input:
//   ltrain  ltrain's own kernels (kernels/batch_norm.h): one kernel each way, with no memset
//           before them; not bitwise repeatable (atomic float sums), so they step aside while
//           deterministic algorithms are asked for.
//   cudnn   cuDNN's BatchNorm fused with its ReLU and residual add (cudnnBatchNormalization-
//           ForwardTrainingEx / BackwardEx, NHWC persistent mode): one kernel each way, a memset
//           before each; with the ReLU only.
//   aten    ATen's batch_norm, then the add and the ReLU in place: takes everything.
// The two fused backends take fp16/bf16 channels_last input on CUDA and give the separate float32
// operators' numbers to fp16/bf16 rounding: the sum and the ReLU are taken in float32 before the
// one rounding. SyncBatchNorm (statistics summed over the data-parallel ranks) takes the place of
// all three in training; evaluation runs ATen's operators with the running statistics.
#include <functional>
#include <string>

#include <torch/torch.h>

#include "ltrain/device/limits.h"

namespace ltrain::ops {

/// A BatchNorm's learned parameters and running statistics, float32 [C] on x's device, and
/// torch.nn.BatchNorm2d's momentum and eps.
struct BatchNormParameters {
  torch::Tensor weight, bias, running_mean, running_var;
  double momentum = 0.1;
  double eps = 1e-5;
};

/// Which backends a model's BatchNorm layers may run on in training; ATen's takes what the others
/// do not. Decided once for a model and shared by its layers.
struct BatchNormBackends {
  /// ltrain's kernels (model.ltrain_batch_norm).
  bool ltrain = true;
  /// cuDNN's fused kernels (model.cudnn_batch_norm).
  bool cudnn = true;
  /// SyncBatchNorm: a differentiable sum over the data-parallel ranks. Set, training normalizes
  /// with the statistics of every rank's batch (float32, ATen operators), as
  /// torch.nn.SyncBatchNorm does, and the backends above are not used.
  std::function<torch::Tensor(const torch::Tensor&)> sum_over_ranks;
  /// The convolutions before the BatchNorm layers hand them their output's statistics where
  /// ops/fused_conv.h takes the convolution (model.fused_conv); only ltrain's kernels use them.
  bool conv_statistics = false;
};

/// batch_norm(x), then with `relu` relu(... + residual) (residual undefined: no add; without
/// `relu` it must be undefined): [B,C,H,W] -> [B,C,H,W]. In training the batch's statistics, with
/// the running statistics updated in place, on the first backend of `backends` that takes the
/// input; in evaluation the running statistics, on ATen's operators. With `second_output` and a
/// residual, where ltrain's kernels ran, *second_output becomes a second autograd output with the
/// same values (ltrain_batch_norm); it is left as it is otherwise. `statistics`: x's per-channel
/// sums and sums of squares where the convolution that made x computed them
/// (ops/fused_conv.h), which ltrain's kernels then use instead of reading x for them; the other
/// backends ignore them.
torch::Tensor batch_norm(const torch::Tensor& x, const torch::Tensor& residual, bool relu,
                         const BatchNormParameters& parameters, bool training, const BatchNormBackends& backends,
                         torch::Tensor* second_output = nullptr, const torch::Tensor& statistics = {});

// ---- The backends one by one, for tests, benchmarks and `ltrain doctor` --------------------------

/// Whether the inputs have the form both fused backends need: x [B,C,H,W] fp16 or bf16 on CUDA,
/// channels_last contiguous, not empty; residual undefined or of x's shape, dtype, device and
/// layout; weight, bias and running statistics float32 [C] on x's device.
bool takes_half_nhwc_batch_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                const BatchNormParameters& parameters);

/// Whether ltrain's kernels run on CUDA `device` (a CUDA build with an image for it, blocks that
/// fit, cooperative launches or clusters), and if not, why.
device::KernelFit ltrain_batch_norm_fit(const torch::Device& device);

/// Whether their cluster reduction runs there (sm_90 code on a GPU with clusters), and if not, why.
device::KernelFit ltrain_batch_norm_cluster_fit(const torch::Device& device);

/// The ltrain backend: training-mode batch_norm(x), then with `relu` relu(... + residual), on
/// ltrain's kernels. Takes x [B,C,H,W] fp16/bf16 on CUDA, channels_last contiguous, C a power of
/// two from 8 to 2048, at least 2 values a channel (a shape ltrain_batch_norm_reduction names),
/// residual of x's shape, dtype and layout. Returns an undefined tensor, having changed nothing,
/// for anything else, while deterministic algorithms or deterministic cuDNN are asked for, and on a
/// GPU the kernels do not run on (after one warning line, the first time).
/// With `second_output` and a residual, where it returns y it also sets *second_output to a
/// second autograd output holding the same values in the same memory: a tensor that two consumers
/// read gets one gradient from each, and the backward kernel adds them as it loads them, where
/// autograd would otherwise add them in a kernel of its own first. Neither output may be changed
/// in place. Without a residual *second_output is left as it is.
/// With `statistics` ([2,C] float32 on x's device, contiguous: the sums over batch and space of
/// x and of x^2, not differentiable), the forward takes the batch's statistics from them and
/// reads x once; statistics of another form are ignored.
torch::Tensor ltrain_batch_norm(const torch::Tensor& x, const torch::Tensor& residual, bool relu,
                                const BatchNormParameters& parameters, torch::Tensor* second_output = nullptr,
                                const torch::Tensor& statistics = {});

/// How ltrain's kernels would combine their blocks' sums for an x of this shape and dtype on its
/// device, with a ReLU and a residual or not: "cluster" (within one thread-block cluster, in a
/// fixed order), "grid" (atomics and a device-wide barrier), "streaming" (the same, reading the
/// rows twice instead of holding them in registers), or "" where they do not take its shape and
/// dtype (or in a CPU build).
std::string ltrain_batch_norm_reduction(const torch::Tensor& x, bool relu, bool residual);

/// Which of ltrain's BatchNorm launches go as programmatic dependents of the kernel before them
/// (sm_90 and later; kernels/batch_norm.h): none, those that reduce within a cluster (tensors of a
/// few thousand rows, whose few blocks find SMs free), or all.
enum class BatchNormDependentLaunch { none, clusters, all };

/// Launch ltrain's kernels `which` says as programmatic dependents: the same numbers, part of the
/// launch gap hidden. Process-wide, as cuDNN's flags are; nothing in a CPU build.
void set_batch_norm_dependent_launch(BatchNormDependentLaunch which);

/// Whether this build has cuDNN's fused kernels (a CUDA build that found cuDNN at configure time).
bool cudnn_batch_norm_built();

/// The cudnn backend: training-mode relu(batch_norm(x) + residual) (residual undefined: no add) on
/// cuDNN's fused kernels. Takes x [B,C,H,W] fp16 or bf16 on CUDA, channels_last contiguous, C a
/// multiple of 4, while cuDNN is enabled. Returns an undefined tensor, having changed nothing, when
/// the inputs or this cuDNN cannot take it; remembers a cuDNN refusal per dtype and add, so later
/// calls step aside without asking again.
torch::Tensor cudnn_batch_norm(const torch::Tensor& x, const torch::Tensor& residual,
                               const BatchNormParameters& parameters);

}  // namespace ltrain::ops
