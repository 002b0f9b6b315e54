#pragma once
// The AdamW step over a model's parameters, one entry that runs the backend chosen here: LibTorch's
// fused kernel where this LibTorch has one and the parameters are on a GPU, else the portable step of
// ATen operators. (SGD's step, with ltrain's own kernel, is in gradient_kernels.h.)
#include <vector>

#include <torch/torch.h>

namespace ltrain::ops {

/// What runs an AdamW step, in the order tried.
enum class AdamwBackend { libtorch, portable };

/// The first backend that runs an AdamW step of parameters on `device`: with `fused` false (or off
/// CUDA, or where this LibTorch has no fused kernel), the portable one.
AdamwBackend adamw_backend(const torch::Device& device, bool fused);

/// torch.optim.AdamW's constants (amsgrad off).
struct AdamwConstants {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  ///< decoupled: p *= 1 - lr * weight_decay
};

/// torch.optim.AdamW's step of every parameter params[i] from gradients[i] (float32, params[i]'s
/// sizes), with its first and second moments exp_avgs[i] and exp_avg_sqs[i], on `backend`.
/// `step_count` ([] float32 on the device) already counts this step, for the bias corrections; the
/// learning rate is read from `lr` ([] float32). The gradients are divided by `grad_scale` ([1]
/// float32) when it is defined, and nothing changes when `found_inf` ([1] float32, when defined) is
/// non-zero.
void adamw_step(AdamwBackend backend, const std::vector<torch::Tensor>& params,
                const std::vector<torch::Tensor>& gradients, const std::vector<torch::Tensor>& exp_avgs,
                const std::vector<torch::Tensor>& exp_avg_sqs, const torch::Tensor& step_count,
                const torch::Tensor& lr, const AdamwConstants& constants, const torch::Tensor& grad_scale,
                const torch::Tensor& found_inf);

}  // namespace ltrain::ops
