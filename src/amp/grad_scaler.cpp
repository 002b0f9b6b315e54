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

void GradScaler::backward(const torch::Tensor& loss) const {
  // d(loss * scale) / d loss is 1 * scale: exactly the scale.
  if (options_.enabled) loss.backward(scale_.to(loss.scalar_type()).view(loss.sizes()));
  else loss.backward();
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
  ops::update_scaler({scale_, growth_tracker_, found_inf_, skipped_steps_, consecutive_skips_}, options_.growth_factor,
                     options_.backoff_factor, options_.growth_interval);
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
