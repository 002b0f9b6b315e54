// The classification loss of a training step, torch's cross_entropy with label smoothing and the
// mean over rows, as two kernels: the forward pass writes the loss and its gradient with respect to
// the logits at once, the backward pass scales that gradient by the loss's own. ATen runs the same
// loss as about 13 kernels of one to a few blocks each (the cast of the logits, log-softmax, the
// negative log-likelihood, the smoothing term, their backward passes), one after another between
// the forward and the backward pass of the step.
// Plain CUDA (no LibTorch headers); ops/cross_entropy.cpp wraps it as an autograd function.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ltrain/kernels/device_fit.h"
#include "ltrain/kernels/element_type.h"

namespace ltrain::kernels {

/// Logits [rows, classes], contiguous; labels [rows] int64.
struct CrossEntropyShape {
  int64_t rows = 0, classes = 0;
};

/// Whether the kernels run on the current device (an image for it in this build), and if not, why.
KernelFit cross_entropy_fit();

/// The most rows and classes the kernels take: one block does every row, a thread a row at a time.
constexpr int64_t kCrossEntropyMostRows = int64_t{1} << 24;
constexpr int64_t kCrossEntropyMostClasses = 1024;

/// loss[0] (float32) = the mean over rows of
///   (1 - smoothing) * -log softmax(x)[label] + smoothing / classes * sum_j -log softmax(x)[j],
/// in float32 from logits of `type`; gradient [rows, classes] float32 = d loss / d logits,
///   (softmax(x)[j] - (1 - smoothing) * [j == label] - smoothing / classes) / rows.
/// A label outside [0, classes) makes the loss and its row's gradient NaN. One block sums the rows
/// in a fixed order: the same inputs give the same bits. Enqueued on `stream`; returns the launch error.
cudaError_t cross_entropy_forward(ElementType type, const void* logits, const int64_t* labels,
                                  const CrossEntropyShape& shape, float smoothing, float* loss, float* gradient,
                                  cudaStream_t stream);

/// grad_logits[i] (of `type`) = gradient[i] * grad_loss[0], for i < count.
cudaError_t cross_entropy_backward(ElementType type, const float* gradient, const float* grad_loss,
                                   void* grad_logits, int64_t count, cudaStream_t stream);

}  // namespace ltrain::kernels
