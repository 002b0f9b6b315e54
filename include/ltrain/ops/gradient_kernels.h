#pragma once
// The optimizer step and the GradScaler's inf/NaN check over a model's gradients. ltrain's own
// gradient kernels (kernels/gradient_kernels.h) read float32, fp16 and bf16 gradients in one list,
// as the backward pass left them, in a few launches; where they do not run, LibTorch's kernels do.
#include <vector>

#include <torch/torch.h>

#include "ltrain/kernels/device_fit.h"

namespace ltrain::ops {

/// What runs an SGD step, in the order tried: ltrain's kernel, LibTorch's fused kernel (where this
/// LibTorch has one), the portable step of ATen operators (the optimizer's own).
enum class SgdBackend { ltrain, libtorch, portable };

/// The first backend that runs an SGD step of parameters on `device`: with `fused` false (or
/// off CUDA), the portable one.
SgdBackend sgd_backend(const torch::Device& device, bool fused);

/// What sgd_backend's answer is called in the log: "ltrain", "libtorch" or "portable".
const char* name_of(SgdBackend backend);

/// Whether ltrain's gradient kernels run on CUDA `device` (a CUDA build with an image for it),
/// and if not, why.
kernels::KernelFit ltrain_gradient_kernels_fit(const torch::Device& device);

/// ltrain_gradient_kernels_fit(device).runs; where it is false, one warning line (the first time)
/// says so, why, and that LibTorch's fused SGD and inf/NaN check run instead.
bool ltrain_gradient_kernels_run_on(const torch::Device& device);

/// torch.optim.SGD's step (dampening 0, momentum buffers started at zero) of every float32
/// parameter params[i] from gradients[i] (float32, fp16 or bf16, params[i]'s sizes), with weight
/// decay weight_decays[i], on ltrain's kernel; `momentum_buffers` is empty when momentum is 0. The
/// gradients are divided by `grad_scale` ([1] float32) when it is defined, and nothing changes when
/// `found_inf` ([1] float32, when defined) is non-zero; the learning rate is read from `lr` on the
/// device. `low_precision_copies`, when not empty, holds one tensor per parameter, undefined or an
/// fp16/bf16 tensor of its sizes and memory order that the step writes the updated values into
/// (amp::LowPrecisionWeights' copies). The parameters' version counters move on, as after any
/// in-place change.
void ltrain_sgd_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& gradients,
                     const std::vector<torch::Tensor>& momentum_buffers, const std::vector<double>& weight_decays,
                     double momentum, bool nesterov, const torch::Tensor& lr, const torch::Tensor& grad_scale,
                     const torch::Tensor& found_inf, const std::vector<torch::Tensor>& low_precision_copies = {});

/// ltrain's inf/NaN check over `gradients` in any mix of float32, fp16 and bf16, read-only:
/// `found_inf` ([1] float32 on the gradients' GPU) becomes 1 on any inf or NaN and 0 otherwise.
/// False, doing nothing, where the kernel cannot read them (a CPU build, a GPU the kernels do not
/// run on, sparse or non-dense tensors).
bool ltrain_find_inf(const std::vector<torch::Tensor>& gradients, const torch::Tensor& found_inf);

}  // namespace ltrain::ops
