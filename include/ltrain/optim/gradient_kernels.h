#pragma once
// torch tensors onto ltrain's own SGD kernel (kernels/sgd_step.h): a step that reads float32, fp16
// and bf16 gradients in one list, as the backward pass left them, in a few launches. The same
// kernel family's inf/NaN check serves the GradScaler (amp/grad_scaler.cpp).
#include <vector>

#include <torch/torch.h>

#include "ltrain/kernels/device_fit.h"
#include "ltrain/optim/optimizer.h"

namespace ltrain::optim {

/// Whether the kernels run on CUDA `device` (a CUDA build with an image for it), and if not, why.
kernels::KernelFit gradient_kernels_fit(const torch::Device& device);

/// gradient_kernels_fit(device).runs; where it is false, one warning line (the first time) says so,
/// why, and that LibTorch's fused SGD and inf/NaN check run instead.
bool gradient_kernels_run_on(const torch::Device& device);

/// torch.optim.SGD's step (dampening 0, momentum buffers started at zero) of every float32
/// parameter params[i] from gradients[i] (float32, fp16 or bf16, params[i]'s sizes), with weight
/// decay weight_decays[i]; `momentum_buffers` is empty when momentum is 0. The gradients are
/// divided by the scaler's grad_scale when it is defined, and nothing changes when its found_inf
/// is non-zero; the learning rate is read from `lr` on the device. `low_precision_copies`, when
/// not empty, holds one tensor per parameter, undefined or an fp16/bf16 tensor of its sizes and
/// memory order that the step writes the updated values into (amp::LowPrecisionWeights' copies).
/// The parameters' version counters move on, as after any in-place change.
void sgd_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& gradients,
              const std::vector<torch::Tensor>& momentum_buffers, const std::vector<double>& weight_decays,
              double momentum, bool nesterov, const torch::Tensor& lr, const amp::ScalerState& scaler,
              const std::vector<torch::Tensor>& low_precision_copies = {});

}  // namespace ltrain::optim
