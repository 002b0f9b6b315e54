#include "ltrain/amp/grad_scaler.h"

#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/ops/gradient_kernels.h"

namespace ltrain::amp {
namespace {
torch::TensorOptions on(const torch::Device& device, torch::ScalarType type) {
  return torch::TensorOptions().dtype(type).device(device);
}
}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options, const torch::Device& device)
    : options_(options),
      scale_(torch::full({1}, options.init_scale, on(device, torch::kFloat32))),
      growth_tracker_(torch::zeros({1}, on(device, torch::kInt32))),
      found_inf_(torch::zeros({1}, on(device, torch::kFloat32))),
      skipped_steps_(torch::zeros({1}, on(device, torch::kInt64))),
      consecutive_skips_(torch::zeros({1}, on(device, torch::kInt64))) {}

torch::Tensor GradScaler::scale_loss(const torch::Tensor& loss) const {
  return options_.enabled ? loss * scale_ : loss;
}

void GradScaler::unscale(const std::vector<torch::Tensor>& grads) {
  if (!options_.enabled) return;
  torch::NoGradGuard no_grad;
  // As torch: the reciprocal in double, then float32.
  ops::unscale_and_find_inf(grads, scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32), found_inf_);
}

void GradScaler::check(const std::vector<torch::Tensor>& grads) {
  if (!options_.enabled) return;
  torch::NoGradGuard no_grad;
  ops::find_inf(grads, found_inf_);
}

ScalerState GradScaler::step_state(bool gradients_unscaled) const {
  if (!options_.enabled) return {};
  return {gradients_unscaled ? torch::Tensor() : scale_, found_inf_};
}

void GradScaler::update() {
  if (!options_.enabled) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor skipped = found_inf_.to(torch::kInt64);  // [1] 0 or 1
  skipped_steps_.add_(skipped);
  consecutive_skips_.add_(skipped).mul_(skipped);  // reset to 0 by a clean step
  if (scale_.is_cuda()) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
    return;
  }
  // Portable version of _amp_update_scale_: back off after a bad step; after growth_interval
  // clean steps grow the scale (when the grown scale is finite) and restart the count.
  const torch::Tensor bad = found_inf_ > 0;
  const torch::Tensor clean_steps = growth_tracker_ + 1;
  const torch::Tensor interval_reached = clean_steps == options_.growth_interval;
  const torch::Tensor grown = scale_ * options_.growth_factor;
  const torch::Tensor grow = interval_reached.logical_and(grown.isfinite());
  scale_.copy_(torch::where(bad, scale_ * options_.backoff_factor, torch::where(grow, grown, scale_)));
  growth_tracker_.copy_(torch::where(bad.logical_or(interval_reached), torch::zeros_like(clean_steps), clean_steps));
}

NamedTensors GradScaler::state() const {
  return {{"scale", scale_},
          {"growth_tracker", growth_tracker_},
          {"skipped_steps", skipped_steps_},
          {"consecutive_skips", consecutive_skips_}};
}

void GradScaler::load_state(const NamedTensors& saved) {
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : state()) {
    const torch::Tensor* stored = find_tensor(saved, name);
    if (!stored) throw DataError(fmt::format("checkpoint has no GradScaler state \"{}\"", name));
    tensor.copy_(*stored);
  }
}

}  // namespace ltrain::amp
