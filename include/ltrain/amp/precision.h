#pragma once
// What a precision mode turns on, in one place: engine::precision_plan reads it from the config's
// precision section (precision.mode, precision.tf32).
#include <torch/torch.h>

namespace ltrain::amp {

/// fp32: nothing; tf32: TF32; fp16: autocast float16 + GradScaler; bf16: autocast bfloat16.
struct PrecisionPlan {
  bool autocast = false;                      ///< forward and loss under autocast
  torch::ScalarType dtype = torch::kFloat32;  ///< autocast's lower-precision dtype
  bool grad_scaler = false;                   ///< fp16: scale the loss, skip steps with inf/NaN gradients
  bool tf32 = false;                          ///< TF32 for float32 matmuls and convolutions
};

}  // namespace ltrain::amp
