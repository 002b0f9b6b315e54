#pragma once
// The training step's classification loss, torch's cross_entropy(logits, labels,
// label_smoothing=s) with the mean over rows, forward and backward, on the first of two backends
// that takes the input:
//   ltrain  ltrain's own kernels (kernels/cross_entropy.h): one kernel writes the loss and its
//           gradient, one scales the gradient in the backward pass; CUDA, contiguous float32, fp16
//           or bf16 logits [rows, classes] (classes <= 1024) and int64 labels [rows]. A label
//           outside [0, classes) gives a NaN loss where ATen stops the process with a device-side
//           assertion; there is no ignored label (ATen's ignore_index).
//   aten    torch::nn::functional::cross_entropy: takes everything.
#include <torch/torch.h>

#include "ltrain/device/limits.h"

namespace ltrain::ops {

/// Which backends the loss may run on; ATen's takes what ltrain's does not.
struct CrossEntropyBackends {
  /// ltrain's kernels (loss.ltrain_kernels).
  bool ltrain = true;
};

/// The mean over rows of the label-smoothed cross-entropy of `logits` [rows, classes] against
/// `labels` [rows] int64, as a [] float32 tensor, computed in float32 whatever the logits' dtype;
/// its gradient has the logits' dtype. On the first backend of `backends` that takes the input;
/// ltrain's agrees with ATen's loss of the logits cast to float32 to float32 rounding.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, double label_smoothing,
                            const CrossEntropyBackends& backends = {});

/// Whether ltrain's kernels run on CUDA `device` (a CUDA build with an image for it), and if not, why.
device::KernelFit ltrain_cross_entropy_fit(const torch::Device& device);

/// Whether ltrain's kernels take cross_entropy(logits, labels, label_smoothing) (on a GPU they do
/// not run on, after one warning line, the first time: no).
bool takes_ltrain_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, double label_smoothing);

}  // namespace ltrain::ops
