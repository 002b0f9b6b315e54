#pragma once
// What precision.mode turns on, in one place.
#include <torch/torch.h>

#include "ltrain/amp/grad_scaler.h"
#include "ltrain/config/config.h"

namespace ltrain::amp {

struct PrecisionPlan {
  bool autocast = false;                      ///< forward and loss under autocast
  torch::ScalarType dtype = torch::kFloat32;  ///< autocast's lower-precision dtype
  bool grad_scaler = false;                   ///< fp16: scale the loss, skip steps with inf/NaN gradients
  bool tf32 = false;                          ///< TF32 for float32 matmuls and convolutions
};

/// fp32: nothing; tf32: TF32; fp16: autocast float16 + GradScaler; bf16: autocast bfloat16.
PrecisionPlan plan_precision(const config::PrecisionSection& precision);

/// The GradScaler for `precision` (disabled unless mode is fp16).
GradScalerOptions scaler_options(const config::PrecisionSection& precision);

}  // namespace ltrain::amp
