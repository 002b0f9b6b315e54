#pragma once
// The SGD step, the GradScaler's inf/NaN check over a model's gradients and its update, each one
// entry that runs the backend chosen here. ltrain's own gradient kernels
// (kernels/gradient_kernels.h) read float32, fp16 and bf16 gradients in one list, as the backward
// pass left them, in a few launches; where they do not run, LibTorch's kernels do, and off CUDA the
// portable versions.
#include <vector>

#include <torch/torch.h>

#include "ltrain/device/limits.h"

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
device::KernelFit ltrain_gradient_kernels_fit(const torch::Device& device);

/// torch.optim.SGD's step (dampening 0, momentum buffers started at zero) of every float32
/// parameter params[i] from gradients[i] (params[i]'s sizes), with weight decay weight_decays[i],
/// on `backend`: ltrain's kernel (one launch for all; float32, fp16 or bf16 gradients), LibTorch's
/// fused kernel (one launch per run of parameters that share a weight decay) or the portable step
/// of ATen operators. `momentum_buffers` is empty when momentum is 0. The gradients are divided by
/// `grad_scale` ([1] float32) when it is defined, and nothing changes when `found_inf` ([1]
/// float32, when defined) is non-zero; the learning rate is read from `lr` ([] float32) on the
/// device. `low_precision_copies` (ltrain's kernel only), when not empty, holds one tensor per
/// parameter, undefined or an fp16/bf16 tensor of its sizes and memory order that the step writes
/// the updated values into (amp::LowPrecisionWeights' copies). std::logic_error for copies given
/// to another backend, or not laid out as their parameters.
void sgd_step(SgdBackend backend, const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& gradients,
              const std::vector<torch::Tensor>& momentum_buffers, const std::vector<double>& weight_decays,
              double momentum, bool nesterov, const torch::Tensor& lr, const torch::Tensor& grad_scale,
              const torch::Tensor& found_inf, const std::vector<torch::Tensor>& low_precision_copies = {});

/// The GradScaler's inf/NaN check of gradients that stay scaled (an optimizer that unscales them
/// in its own kernel takes the scale): `found_inf` ([1] float32 on the gradients' device) becomes
/// 1 on any inf or NaN among `gradients` and 0 otherwise. On ltrain's kernel where it reads them
/// (any mix of float32, fp16 and bf16 on a GPU it runs on, read only), else ATen's check (CUDA),
/// else the portable one.
void find_inf(const std::vector<torch::Tensor>& gradients, const torch::Tensor& found_inf);

/// The GradScaler's unscale: every gradient multiplied by `inv_scale` ([1] float32) in place, and
/// `found_inf` as find_inf's. ATen's multi-tensor kernel on CUDA, else the portable version with
/// the same rules (LibTorch 1.13 has no CPU kernel for it).
void unscale_and_find_inf(const std::vector<torch::Tensor>& gradients, const torch::Tensor& inv_scale,
                          const torch::Tensor& found_inf);

/// The GradScaler's tensors on one device, each [1].
struct ScalerTensors {
  torch::Tensor scale;              // float32
  torch::Tensor growth_tracker;     // int32: clean steps since the scale last changed
  torch::Tensor found_inf;          // float32: this step's, 0 or 1
  torch::Tensor skipped_steps;      // int64
  torch::Tensor consecutive_skips;  // int64
};

/// The GradScaler's update after a step, as torch.amp.GradScaler.update (ATen's
/// _amp_update_scale_ rules), and its counts of skipped steps (consecutive ones back to 0 after a
/// clean step): on ltrain's one-thread kernel where the gradient kernels run (one launch instead
/// of five), else ATen's update and operators, else the portable version. The same values on each.
void update_scaler(const ScalerTensors& scaler, double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace ltrain::ops
