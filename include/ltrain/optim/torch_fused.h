#pragma once
// LibTorch's own fused multi-tensor optimizer kernels (torch.optim's fused=True), where this
// LibTorch has them with a tensor learning rate (2.2 and later, CUDA tensors).
#include <vector>

#include <torch/torch.h>

#include "ltrain/core/torch_compat.h"

namespace ltrain::optim {

/// True when this LibTorch has _fused_sgd_ and _fused_adamw_ with a tensor learning rate.
constexpr bool has_fused_optimizers() { return LTRAIN_TORCH_HAS_FUSED_OPTIMIZERS; }

/// torch.optim.SGD(fused=True)'s kernel over one parameter group (float32 parameters, gradients
/// and buffers, momentum buffers started at zero; `momentum_buffers` empty when momentum is 0).
/// `grad_scale` / `found_inf` may be undefined.
void fused_sgd(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
               const std::vector<torch::Tensor>& momentum_buffers, double weight_decay, double momentum,
               const torch::Tensor& lr, bool nesterov, const torch::Tensor& grad_scale, const torch::Tensor& found_inf);

/// torch.optim.AdamW(fused=True)'s kernel over one parameter group; `steps` already incremented.
void fused_adamw(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                 const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                 const std::vector<torch::Tensor>& steps, const torch::Tensor& lr, double beta1, double beta2,
                 double weight_decay, double eps, const torch::Tensor& grad_scale, const torch::Tensor& found_inf);

}  // namespace ltrain::optim
