#pragma once
// torch tensors onto ltrain's own optimizer kernels (kernels/sgd_step.h): the GradScaler's inf/NaN
// check, read-only, and an SGD step that reads fp16/bf16 gradients as the backward pass left
// them. Both take float32, fp16 and bf16 gradients in one list and run in a few launches.
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

/// True when the kernels can read every one of `gradients`: defined, on a GPU they run on,
/// float32, fp16 or bf16, and dense (no gaps, no overlaps).
bool takes_gradient_kernels(const std::vector<torch::Tensor>& gradients);

/// found_inf ([1] float32 on the GPU) becomes 1 when any element of `gradients` is inf or NaN
/// and is left as it is otherwise. Needs takes_gradient_kernels(gradients).
void find_non_finite(const std::vector<torch::Tensor>& gradients, const torch::Tensor& found_inf);

/// torch.optim.SGD's step (dampening 0, momentum buffers started at zero) of every float32
/// parameter params[i] from gradients[i] (float32, fp16 or bf16, params[i]'s sizes), with weight
/// decay weight_decays[i]; `momentum_buffers` is empty when momentum is 0. The gradients are
/// divided by the scaler's grad_scale when it is defined, and nothing changes when its found_inf
/// is non-zero; the learning rate is read from `lr` on the device. `low_precision_copies`, when
/// not empty, holds one tensor per parameter, undefined or an fp16/bf16 tensor of its sizes and
/// memory order that the step writes the updated values into (amp::LowPrecisionWeights' mirrors).
/// The parameters' version counters move on, as after any in-place change.
void sgd_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& gradients,
              const std::vector<torch::Tensor>& momentum_buffers, const std::vector<double>& weight_decays,
              double momentum, bool nesterov, const torch::Tensor& lr, const ScalerState& scaler,
              const std::vector<torch::Tensor>& low_precision_copies = {});

}  // namespace ltrain::optim
