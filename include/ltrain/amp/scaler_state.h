#pragma once
// What a GradScaler hands the optimizer step, on the device: the step divides the gradients by
// grad_scale when it is defined and changes nothing when found_inf is 1.
#include <torch/torch.h>

namespace ltrain::amp {

/// Both are optional (undefined tensors): without a scaler the step runs as it is.
struct ScalerState {
  torch::Tensor grad_scale;  ///< [1] float32: gradients are still multiplied by it and are divided in the step
  torch::Tensor found_inf;   ///< [1] float32: 1 makes the step change nothing (decided on the device)
};

}  // namespace ltrain::amp
