#include "ltrain/ops/adamw.h"

#include <stdexcept>

#include "ltrain/core/torch_compat.h"

namespace ltrain::ops {
namespace {

void portable_adamw_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& gradients,
                         const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                         const torch::Tensor& step_count, const torch::Tensor& lr, const AdamwConstants& constants,
                         const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  // [1] bool on the device, or undefined when no step is ever skipped.
  const torch::Tensor skip = found_inf.defined() ? found_inf > 0 : torch::Tensor();
  const auto assign = [&](const torch::Tensor& target, const torch::Tensor& value) {
    target.copy_(skip.defined() ? torch::where(skip, target, value) : value);
  };
  // 0-dim device tensors: 1 - beta^t for the bias corrections.
  const torch::Tensor correction1 = 1.0 - torch::pow(constants.beta1, step_count);
  const torch::Tensor correction2_sqrt = torch::sqrt(1.0 - torch::pow(constants.beta2, step_count));
  const torch::Tensor step_size = lr / correction1;
  const torch::Tensor decay_factor = 1.0 - lr * constants.weight_decay;
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& param = params[i];
    const torch::Tensor grad = grad_scale.defined() ? gradients[i] / grad_scale : gradients[i];
    const torch::Tensor& m = exp_avgs[i];
    const torch::Tensor& v = exp_avg_sqs[i];
    const torch::Tensor new_m = m.lerp(grad, 1.0 - constants.beta1);  // b1 m + (1 - b1) g
    // b2 v + (1 - b2) g^2
    const torch::Tensor new_v = v.mul(constants.beta2).addcmul_(grad, grad, 1.0 - constants.beta2);
    const torch::Tensor denom = (new_v.sqrt() / correction2_sqrt).add_(constants.eps);
    // decoupled weight decay, then p -= lr / c1 * m / denom
    assign(param, param.mul(decay_factor).addcdiv_(new_m * step_size, denom, -1.0));
    assign(m, new_m);
    assign(v, new_v);
  }
}

}  // namespace

AdamwBackend adamw_backend(const torch::Device& device, bool fused) {
  return fused && device.is_cuda() && compat::has_fused_optimizers() ? AdamwBackend::libtorch : AdamwBackend::portable;
}

void adamw_step(AdamwBackend backend, const std::vector<torch::Tensor>& params,
                const std::vector<torch::Tensor>& gradients, const std::vector<torch::Tensor>& exp_avgs,
                const std::vector<torch::Tensor>& exp_avg_sqs, const torch::Tensor& step_count,
                const torch::Tensor& lr, const AdamwConstants& constants, const torch::Tensor& grad_scale,
                const torch::Tensor& found_inf) {
  if (params.empty()) return;
  if (gradients.size() != params.size() || exp_avgs.size() != params.size() || exp_avg_sqs.size() != params.size())
    throw std::logic_error("adamw_step: needs a gradient and both moments per parameter");
  switch (backend) {
    case AdamwBackend::libtorch: {
      // The kernel reads one step count per parameter; they all share this one.
      const std::vector<torch::Tensor> steps(params.size(), step_count);
      compat::fused_adamw(params, gradients, exp_avgs, exp_avg_sqs, steps, lr, constants.beta1, constants.beta2,
                          constants.weight_decay, constants.eps, grad_scale, found_inf);
      return;
    }
    case AdamwBackend::portable:
      portable_adamw_step(params, gradients, exp_avgs, exp_avg_sqs, step_count, lr, constants, grad_scale, found_inf);
      return;
  }
}

}  // namespace ltrain::ops
