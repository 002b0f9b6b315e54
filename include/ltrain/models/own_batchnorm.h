#pragma once
// Training-mode BatchNorm, alone or with the ReLU (and residual add) after it, on ltrain's own
// kernels (kernels/batch_norm_nhwc.h): one kernel forward and one backward, with no memsets
// before them, where cuDNN's fused path (models/fused_batchnorm.h) has a memset before each.
// Same numbers as the separate float32 operators to fp16/bf16 rounding; not bitwise repeatable
// for large tensors (atomic float sums), so they step aside when deterministic algorithms are
// asked for.
#include <torch/torch.h>

#include <string>

#include "ltrain/kernels/device_fit.h"
#include "ltrain/models/fused_batchnorm.h"

namespace ltrain::models {

/// Whether the kernels run on CUDA `device` (a CUDA build with an image for it, blocks that fit,
/// cooperative launches or clusters), and if not, why.
kernels::KernelFit own_batchnorm_fit(const torch::Device& device);

/// Whether their cluster reduction runs there (sm_90 code on a GPU with clusters), and if not, why.
kernels::KernelFit own_batchnorm_cluster_fit(const torch::Device& device);

/// batch_norm(x) with batch statistics, then relu(... + residual) when `relu` is set (residual:
/// undefined for no add; without `relu` it must be undefined), updating the running statistics in
/// place, differentiable in x, residual, weight and bias. Takes x [B,C,H,W] fp16/bf16 on CUDA,
/// channels_last contiguous, C a power of two from 8 to 2048, at least 2 values a channel (a
/// shape own_batchnorm_reduction names), residual of x's shape, dtype and layout.
/// Returns an undefined tensor, having changed nothing, for anything else, while deterministic
/// algorithms or deterministic cuDNN are asked for, and on a GPU the kernels do not run on (after
/// one warning line, the first time).
/// With `second_output` and a residual, where it returns y it also sets *second_output to a
/// second autograd output holding the same values in the same memory: a tensor that two consumers
/// read gets one gradient from each, and the backward kernel adds them as it loads them, where
/// autograd would otherwise add them in a kernel of its own first. Neither output may be changed
/// in place. Without a residual *second_output is left as it is.
torch::Tensor try_own_batchnorm(const torch::Tensor& x, const torch::Tensor& residual, bool relu,
                                const BatchNormParameters& parameters, torch::Tensor* second_output = nullptr);

/// How the kernels would combine their blocks' sums for an x of this shape and dtype on its
/// device, with a ReLU and a residual or not: "cluster" (within one thread-block cluster, in a
/// fixed order), "grid" (atomics and a device-wide barrier), "streaming" (the same, reading the
/// rows twice instead of holding them in registers), or "" where they do not take its
/// shape and dtype (or in a CPU build). For tests and benchmarks.
std::string own_batchnorm_reduction(const torch::Tensor& x, bool relu, bool residual);

}  // namespace ltrain::models
