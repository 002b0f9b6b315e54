#include "ltrain/ops/gradient_kernels.h"

#include "ltrain/core/torch_compat.h"

#include <stdexcept>
#include <string>

#if LTRAIN_WITH_CUDA
#include "ltrain/kernels/gradient_kernels.h"
#include "ltrain/ops/kernel_bridge.h"
#endif

namespace ltrain::ops {
namespace {

#if LTRAIN_WITH_CUDA

/// Whether a and b (same sizes, each dense) hold their elements in one memory order: equal strides
/// in every dimension of more than one element. A 1x1 convolution's weight [out, in, 1, 1] has
/// different strides contiguous and channels_last but one order; copying such gradients cost
/// ResNet-50 36 copies a step.
bool same_memory_order(const torch::Tensor& a, const torch::Tensor& b) {
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

const float* device_float(const torch::Tensor& tensor) {
  return tensor.defined() ? tensor.data_ptr<float>() : nullptr;
}

bool ltrain_gradient_kernels_run_on(const torch::Device& device) { return gradient_kernels_run_on(device); }

void ltrain_sgd_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& gradients,
                     const std::vector<torch::Tensor>& momentum_buffers, const std::vector<double>& weight_decays,
                     double momentum, bool nesterov, const torch::Tensor& lr, const torch::Tensor& grad_scale,
                     const torch::Tensor& found_inf, const std::vector<torch::Tensor>& low_precision_copies) {
  if (params.empty()) return;
  if (!low_precision_copies.empty() && low_precision_copies.size() != params.size())
    throw std::logic_error("sgd_step: low_precision_copies needs one entry per parameter");
  std::vector<torch::Tensor> keep_alive;  // gradients copied into their parameter's layout
  std::vector<kernels::SgdParameter> entries;
  entries.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& param = params[i];
    torch::Tensor gradient = gradients[i];
    if (gradient.sizes() != param.sizes())
      throw std::logic_error("sgd_step: a gradient's sizes differ from its parameter's");
    // The kernel walks parameter, buffer and gradient in memory order: their strides must agree.
    if (!same_memory_order(gradient, param)) {
      keep_alive.push_back(torch::empty_like(param, gradient.options()).copy_(gradient));
      gradient = keep_alive.back();
    }
    kernels::SgdParameter entry;
    entry.value = param.data_ptr<float>();
    entry.momentum_buffer = momentum_buffers.empty() ? nullptr : momentum_buffers[i].data_ptr<float>();
    entry.gradient = gradient_view_of(gradient);
    entry.weight_decay = static_cast<float>(weight_decays[i]);
    if (!low_precision_copies.empty() && low_precision_copies[i].defined()) {
      const torch::Tensor& copy = low_precision_copies[i];
      const bool laid_out_as_param =
          copy.sizes() == param.sizes() && copy.is_non_overlapping_and_dense() && same_memory_order(copy, param);
      const bool low_precision = element_type_of(copy.scalar_type(), entry.copy_type) &&
                                 entry.copy_type != kernels::ElementType::float32;
      if (!laid_out_as_param || !low_precision)
        throw std::logic_error(
            "sgd_step: a low-precision copy is not an fp16/bf16 tensor laid out as its parameter");
      entry.low_precision_copy = copy.data_ptr();
    }
    entries.push_back(entry);
  }
  kernels::SgdSettings settings;
  settings.momentum = static_cast<float>(momentum);
  settings.nesterov = nesterov;
  settings.learning_rate = lr.data_ptr<float>();
  settings.gradient_scale = device_float(grad_scale);
  settings.found_inf = device_float(found_inf);
  throw_on_error(
      kernels::sgd_step(entries.data(), static_cast<int64_t>(entries.size()), settings, current_stream_of(lr)),
      "SGD kernel");
  // Written in place behind autograd's back: say so, as ATen's in-place operators do (what
  // amp::LowPrecisionWeights reads to tell whether its copies still match).
  for (const torch::Tensor& param : params) param.unsafeGetTensorImpl()->bump_version();
}

bool ltrain_find_inf(const std::vector<torch::Tensor>& gradients, const torch::Tensor& found_inf) {
  if (!found_inf.is_cuda() || !gradient_kernels_read(gradients)) return false;
  std::vector<kernels::GradientView> views;
  views.reserve(gradients.size());
  for (const torch::Tensor& gradient : gradients) views.push_back(gradient_view_of(gradient));
  found_inf.zero_();  // the kernel only ever sets it
  throw_on_error(kernels::find_inf(views.data(), static_cast<int64_t>(views.size()),
                                            found_inf.data_ptr<float>(), current_stream_of(found_inf)),
                          "inf/NaN check kernel");
  return true;
}

bool ltrain_update_scaler(const ScalerTensors& scaler, double growth_factor, double backoff_factor,
                          int64_t growth_interval) {
  if (!scaler.scale.is_cuda() || !ltrain_gradient_kernels_run_on(scaler.scale.device())) return false;
  kernels::ScalerCounters counters;
  counters.scale = scaler.scale.data_ptr<float>();
  counters.growth_tracker = scaler.growth_tracker.data_ptr<int32_t>();
  counters.found_inf = scaler.found_inf.data_ptr<float>();
  counters.skipped_steps = scaler.skipped_steps.data_ptr<int64_t>();
  counters.consecutive_skips = scaler.consecutive_skips.data_ptr<int64_t>();
  throw_on_error(kernels::update_scaler(counters, growth_factor, backoff_factor, static_cast<int32_t>(growth_interval),
                                        current_stream_of(scaler.scale)),
                 "GradScaler update kernel");
  for (const torch::Tensor& tensor : {scaler.scale, scaler.growth_tracker, scaler.skipped_steps,
                                      scaler.consecutive_skips})
    tensor.unsafeGetTensorImpl()->bump_version();
  return true;
}

#else

bool ltrain_gradient_kernels_run_on(const torch::Device&) { return false; }

bool ltrain_update_scaler(const ScalerTensors&, double, double, int64_t) { return false; }

void ltrain_sgd_step(const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
                     const std::vector<torch::Tensor>&, const std::vector<double>&, double, bool, const torch::Tensor&,
                     const torch::Tensor&, const torch::Tensor&, const std::vector<torch::Tensor>&) {
  throw std::logic_error("sgd_step: this build has no CUDA kernels");
}

bool ltrain_find_inf(const std::vector<torch::Tensor>&, const torch::Tensor&) { return false; }

#endif  // LTRAIN_WITH_CUDA

/// LibTorch's fused SGD, one launch per run of parameters that share a weight decay (it takes one).
void libtorch_sgd_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& gradients,
                       const std::vector<torch::Tensor>& momentum_buffers, const std::vector<double>& weight_decays,
                       double momentum, bool nesterov, const torch::Tensor& lr, const torch::Tensor& grad_scale,
                       const torch::Tensor& found_inf) {
  const auto part = [](const std::vector<torch::Tensor>& all, size_t first, size_t end) {
    return all.empty() ? all
                       : std::vector<torch::Tensor>(all.begin() + static_cast<std::ptrdiff_t>(first),
                                                    all.begin() + static_cast<std::ptrdiff_t>(end));
  };
  for (size_t first = 0, end = 0; first < params.size(); first = end) {
    while (end < params.size() && weight_decays[end] == weight_decays[first]) ++end;
    compat::fused_sgd(part(params, first, end), part(gradients, first, end), part(momentum_buffers, first, end),
                      weight_decays[first], momentum, lr, nesterov, grad_scale, found_inf);
  }
}

/// The SGD step in ATen operators, with the fused kernels' rules: gradients divided by the scale
/// still in them, nothing written where the scaler found inf/NaN (decided on the device).
void portable_sgd_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& gradients,
                       const std::vector<torch::Tensor>& momentum_buffers, const std::vector<double>& weight_decays,
                       double momentum, bool nesterov, const torch::Tensor& lr, const torch::Tensor& grad_scale,
                       const torch::Tensor& found_inf) {
  // [1] bool on the device, or undefined when no step is ever skipped.
  const torch::Tensor skip = found_inf.defined() ? found_inf > 0 : torch::Tensor();
  const auto assign = [&](const torch::Tensor& target, const torch::Tensor& value) {
    target.copy_(skip.defined() ? torch::where(skip, target, value) : value);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& param = params[i];
    // d = g + weight_decay * p   (L2 penalty folded into the gradient)
    torch::Tensor direction = grad_scale.defined() ? gradients[i] / grad_scale : gradients[i];
    if (weight_decays[i] != 0.0) direction = direction.add(param, weight_decays[i]);
    if (momentum != 0.0) {
      // The buffer starts at zero, which equals PyTorch's "first step copies the gradient":
      // momentum * 0 + g == g exactly.
      const torch::Tensor& buffer = momentum_buffers[i];
      const torch::Tensor new_buffer = buffer.mul(momentum).add_(direction);
      direction = nesterov ? direction.add(new_buffer, momentum) : new_buffer;
      assign(buffer, new_buffer);
    }
    assign(param, param.addcmul(direction, lr, -1.0));  // p - lr * d, lr read on the device
  }
}

/// unscale_and_find_inf off CUDA: found_inf is the largest of its value and each gradient's "has
/// an inf or NaN", as ATen's kernel sets it.
void portable_unscale_and_find_inf(const std::vector<torch::Tensor>& gradients, const torch::Tensor& inv_scale,
                                   const torch::Tensor& found_inf) {
  for (const auto& gradient : gradients) {
    found_inf.copy_(
        torch::maximum(found_inf, gradient.isfinite().logical_not().any().to(torch::kFloat32).reshape({1})));
    gradient.mul_(inv_scale);
  }
}

/// The portable update: _amp_update_scale_'s rules in ATen operators.
void portable_update_scale(const ScalerTensors& scaler, double growth_factor, double backoff_factor,
                           int64_t growth_interval) {
  const torch::Tensor bad = scaler.found_inf > 0;
  const torch::Tensor clean_steps = scaler.growth_tracker + 1;
  const torch::Tensor interval_reached = clean_steps == growth_interval;
  const torch::Tensor grown = scaler.scale * growth_factor;
  const torch::Tensor grow = interval_reached.logical_and(grown.isfinite());
  scaler.scale.copy_(torch::where(bad, scaler.scale * backoff_factor, torch::where(grow, grown, scaler.scale)));
  scaler.growth_tracker.copy_(
      torch::where(bad.logical_or(interval_reached), torch::zeros_like(clean_steps), clean_steps));
}

}  // namespace

SgdBackend sgd_backend(const torch::Device& device, bool fused) {
  if (!fused || !device.is_cuda()) return SgdBackend::portable;
  if (ltrain_gradient_kernels_run_on(device)) return SgdBackend::ltrain;
  return compat::has_fused_optimizers() ? SgdBackend::libtorch : SgdBackend::portable;
}

const char* name_of(SgdBackend backend) {
  switch (backend) {
    case SgdBackend::ltrain: return "ltrain";
    case SgdBackend::libtorch: return "libtorch";
    case SgdBackend::portable: return "portable";
  }
  return "?";
}

device::KernelFit ltrain_gradient_kernels_fit(const torch::Device& device) {
#if LTRAIN_WITH_CUDA
  return fit_on(device, kernels::gradient_kernels_fit);
#else
  (void)device;
  return {false, "a CPU build has no CUDA kernels"};
#endif
}

void sgd_step(SgdBackend backend, const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& gradients,
              const std::vector<torch::Tensor>& momentum_buffers, const std::vector<double>& weight_decays,
              double momentum, bool nesterov, const torch::Tensor& lr, const torch::Tensor& grad_scale,
              const torch::Tensor& found_inf, const std::vector<torch::Tensor>& low_precision_copies) {
  if (params.empty()) return;
  if (gradients.size() != params.size() || weight_decays.size() != params.size() ||
      (momentum != 0.0 && momentum_buffers.size() != params.size()))
    throw std::logic_error("sgd_step: needs a gradient, a weight decay and (with momentum) a buffer per parameter");
  switch (backend) {
    case SgdBackend::ltrain:
      ltrain_sgd_step(params, gradients, momentum_buffers, weight_decays, momentum, nesterov, lr, grad_scale,
                      found_inf, low_precision_copies);
      return;
    case SgdBackend::libtorch:
    case SgdBackend::portable:
      if (!low_precision_copies.empty())
        throw std::logic_error("sgd_step: only ltrain's kernel writes low-precision copies");
      if (backend == SgdBackend::libtorch)
        libtorch_sgd_step(params, gradients, momentum_buffers, weight_decays, momentum, nesterov, lr, grad_scale,
                          found_inf);
      else
        portable_sgd_step(params, gradients, momentum_buffers, weight_decays, momentum, nesterov, lr, grad_scale,
                          found_inf);
      return;
  }
}

void find_inf(const std::vector<torch::Tensor>& gradients, const torch::Tensor& found_inf) {
  if (ltrain_find_inf(gradients, found_inf)) return;
  unscale_and_find_inf(gradients, torch::ones({1}, found_inf.options()), found_inf);
}

void unscale_and_find_inf(const std::vector<torch::Tensor>& gradients, const torch::Tensor& inv_scale,
                          const torch::Tensor& found_inf) {
  found_inf.zero_();
  if (gradients.empty()) return;
  if (!found_inf.is_cuda()) return portable_unscale_and_find_inf(gradients, inv_scale, found_inf);
  // ATen's multi-tensor kernel: gradients *= inv_scale, found_inf = 1 on any inf/NaN. It takes the
  // flag by non-const reference: a handle to the same storage.
  torch::Tensor found = found_inf;
  at::_amp_foreach_non_finite_check_and_unscale_(gradients, found, inv_scale);
}

void update_scaler(const ScalerTensors& scaler, double growth_factor, double backoff_factor, int64_t growth_interval) {
  torch::NoGradGuard no_grad;
  if (ltrain_update_scaler(scaler, growth_factor, backoff_factor, growth_interval)) return;
  const torch::Tensor skipped = scaler.found_inf.to(torch::kInt64);  // [1] 0 or 1
  scaler.skipped_steps.add_(skipped);
  scaler.consecutive_skips.add_(skipped).mul_(skipped);  // back to 0 after a clean step
  if (scaler.scale.is_cuda()) {
    torch::Tensor scale = scaler.scale, growth_tracker = scaler.growth_tracker;  // handles to the same storage
    at::_amp_update_scale_(scale, growth_tracker, scaler.found_inf, growth_factor, backoff_factor, growth_interval);
    return;
  }
  portable_update_scale(scaler, growth_factor, backoff_factor, growth_interval);
}

}  // namespace ltrain::ops
