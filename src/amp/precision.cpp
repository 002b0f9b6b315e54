#include "ltrain/amp/precision.h"

namespace ltrain::amp {

PrecisionPlan plan_precision(const config::PrecisionSection& precision) {
  PrecisionPlan plan;
  plan.tf32 = precision.tf32 || precision.mode == config::PrecisionMode::tf32;
  if (precision.mode == config::PrecisionMode::fp16) {
    plan.autocast = true;
    plan.dtype = torch::kFloat16;
    plan.grad_scaler = true;
  } else if (precision.mode == config::PrecisionMode::bf16) {
    plan.autocast = true;
    plan.dtype = torch::kBFloat16;
  }
  return plan;
}

GradScalerOptions scaler_options(const config::PrecisionSection& precision) {
  GradScalerOptions options;
  options.enabled = plan_precision(precision).grad_scaler;
  options.init_scale = precision.loss_scale_init;
  options.growth_factor = precision.loss_scale_growth_factor;
  options.backoff_factor = precision.loss_scale_backoff_factor;
  options.growth_interval = precision.loss_scale_growth_interval;
  return options;
}

}  // namespace ltrain::amp
