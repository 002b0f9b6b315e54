#include "ltrain/optim/optimizer.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/ops/gradient_kernels.h"

namespace ltrain::optim {
namespace {

/// The gradient the update uses: divided by the scaler's scale when it is still in it.
torch::Tensor unscaled(const torch::Tensor& grad, const amp::ScalerState& scaler) {
  return scaler.grad_scale.defined() ? grad / scaler.grad_scale : grad;
}

/// target = value, or target unchanged where the scaler found inf/NaN (decided on the device).
void assign(const torch::Tensor& target, const torch::Tensor& value, const torch::Tensor& skip) {
  target.copy_(skip.defined() ? torch::where(skip, target, value) : value);
}

/// [1] bool on the device, or undefined when no step is ever skipped.
torch::Tensor skip_mask(const amp::ScalerState& scaler) {
  return scaler.found_inf.defined() ? scaler.found_inf > 0 : torch::Tensor();
}

using ops::SgdBackend;

/// torch.optim.SGD (dampening 0, not maximizing), stepped by ops::sgd_step on the backend
/// ops::sgd_backend chose.
class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, const config::OptimSection& options, const torch::Device& device,
      SgdBackend backend)
      : Optimizer(std::move(groups), device, backend != SgdBackend::portable),
        momentum_(options.momentum),
        nesterov_(options.nesterov),
        backend_(backend) {
    for (const auto& group : groups_) {
      for (size_t i = 0; i < group.params.size(); ++i) {
        params_.push_back(group.params[i]);
        weight_decays_.push_back(group.weight_decay);
        if (momentum_ == 0.0) continue;
        momentum_buffers_.emplace_back("momentum_buffer/" + group.names[i], torch::zeros_like(group.params[i]));
        buffers_.push_back(momentum_buffers_.back().second);
      }
    }
  }

  void step(const amp::ScalerState& scaler, const std::vector<torch::Tensor>& given) override {
    torch::NoGradGuard no_grad;
    ops::sgd_step(backend_, params_, given.empty() ? gradients() : given, buffers_, weight_decays_, momentum_,
                  nesterov_, lr_, scaler.grad_scale, scaler.found_inf, low_precision_copies_);
  }

  const char* step_kernel() const override {
    switch (backend_) {
      case SgdBackend::ltrain: return "fused (ltrain's SGD kernel)";
      case SgdBackend::libtorch: return "fused (LibTorch's SGD kernel)";
      case SgdBackend::portable: break;
    }
    return "portable";
  }
  bool takes_low_precision_gradients() const override { return backend_ == SgdBackend::ltrain; }
  bool write_low_precision_copies(std::vector<torch::Tensor> copies) override {
    if (backend_ != SgdBackend::ltrain) return false;
    if (copies.size() != params_.size())
      throw std::logic_error("write_low_precision_copies: needs one entry per parameter");
    low_precision_copies_ = std::move(copies);
    return true;
  }

  NamedTensors state() const override { return momentum_buffers_; }

 private:
  double momentum_;
  bool nesterov_;
  std::vector<torch::Tensor> params_;   // every group's, in group order
  std::vector<double> weight_decays_;   // each parameter's group's
  NamedTensors momentum_buffers_;       // one per parameter, in group order (none without momentum)
  std::vector<torch::Tensor> buffers_;  // the same tensors, as the kernel takes them
  std::vector<torch::Tensor> low_precision_copies_;  // empty, or one per parameter (write_low_precision_copies)
  SgdBackend backend_;
};

/// torch.optim.AdamW (amsgrad off). The step count lives on the device so that bias
/// corrections need no host value; a skipped step does not count.
class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, const config::OptimSection& options, const torch::Device& device, bool fused)
      : Optimizer(std::move(groups), device, fused),
        beta1_(options.betas.at(0)),
        beta2_(options.betas.at(1)),
        eps_(options.eps),
        step_count_(torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device))) {
    for (const auto& group : groups_) {
      for (size_t i = 0; i < group.params.size(); ++i) {
        exp_avg_.emplace_back("exp_avg/" + group.names[i], torch::zeros_like(group.params[i]));
        exp_avg_sq_.emplace_back("exp_avg_sq/" + group.names[i], torch::zeros_like(group.params[i]));
      }
    }
  }

  void step(const amp::ScalerState& scaler, const std::vector<torch::Tensor>& given) override {
    torch::NoGradGuard no_grad;
    const std::vector<torch::Tensor> grads = given.empty() ? gradients() : given;
    step_count_.add_(1.0);
    size_t first = 0;  // index of the group's first parameter
    for (const auto& group : groups_) {
      if (fused_) fused_group_step(group, first, grads, scaler);
      else portable_group_step(group, first, grads, scaler);
      first += group.params.size();
    }
    if (scaler.found_inf.defined()) step_count_.sub_(scaler.found_inf.reshape({}));
  }

  const char* step_kernel() const override { return fused_ ? "fused (LibTorch's AdamW kernel)" : "portable"; }

  NamedTensors state() const override {
    NamedTensors out{{"step", step_count_}};
    out.insert(out.end(), exp_avg_.begin(), exp_avg_.end());
    out.insert(out.end(), exp_avg_sq_.begin(), exp_avg_sq_.end());
    return out;
  }

 private:
  void fused_group_step(const ParamGroup& group, size_t first, const std::vector<torch::Tensor>& all_grads,
                        const amp::ScalerState& scaler) {
    std::vector<torch::Tensor> grads, averages, squares;
    for (size_t i = 0; i < group.params.size(); ++i) {
      grads.push_back(all_grads[first + i]);
      averages.push_back(exp_avg_[first + i].second);
      squares.push_back(exp_avg_sq_[first + i].second);
    }
    // The kernel reads one step count per parameter; they all share ours.
    const std::vector<torch::Tensor> steps(group.params.size(), step_count_);
    compat::fused_adamw(group.params, grads, averages, squares, steps, lr_, beta1_, beta2_, group.weight_decay, eps_,
                        scaler.grad_scale, scaler.found_inf);
  }

  void portable_group_step(const ParamGroup& group, size_t first, const std::vector<torch::Tensor>& grads,
                           const amp::ScalerState& scaler) {
    const torch::Tensor skip = skip_mask(scaler);
    // 0-dim device tensors: 1 - beta^t for the bias corrections.
    const torch::Tensor correction1 = 1.0 - torch::pow(beta1_, step_count_);
    const torch::Tensor correction2_sqrt = torch::sqrt(1.0 - torch::pow(beta2_, step_count_));
    const torch::Tensor step_size = lr_ / correction1;
    const torch::Tensor decay_factor = 1.0 - lr_ * group.weight_decay;
    for (size_t i = 0; i < group.params.size(); ++i) {
      const torch::Tensor& param = group.params[i];
      const torch::Tensor grad = unscaled(grads[first + i], scaler);
      const torch::Tensor& m = exp_avg_[first + i].second;
      const torch::Tensor& v = exp_avg_sq_[first + i].second;
      const torch::Tensor new_m = m.lerp(grad, 1.0 - beta1_);                          // b1 m + (1 - b1) g
      const torch::Tensor new_v = v.mul(beta2_).addcmul_(grad, grad, 1.0 - beta2_);  // b2 v + (1 - b2) g^2
      const torch::Tensor denom = (new_v.sqrt() / correction2_sqrt).add_(eps_);
      // decoupled weight decay, then p -= lr / c1 * m / denom
      assign(param, param.mul(decay_factor).addcdiv_(new_m * step_size, denom, -1.0), skip);
      assign(m, new_m, skip);
      assign(v, new_v, skip);
    }
  }

  double beta1_;
  double beta2_;
  double eps_;
  torch::Tensor step_count_;  // 0-dim float32 on the device
  NamedTensors exp_avg_;
  NamedTensors exp_avg_sq_;
};

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, const torch::Device& device, bool fused)
    : groups_(std::move(groups)),
      lr_(torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device))),
      fused_(fused) {}

void Optimizer::zero_grad(bool set_to_none) {
  torch::NoGradGuard no_grad;
  for (const auto& group : groups_) {
    for (const auto& param : group.params) {
      if (!param.grad().defined()) continue;
      if (set_to_none) param.mutable_grad().reset();
      else param.mutable_grad().zero_();
    }
  }
}

std::vector<torch::Tensor> Optimizer::gradients() const {
  std::vector<torch::Tensor> grads;
  for (const auto& group : groups_)
    for (const auto& param : group.params) grads.push_back(param.grad());
  return grads;
}

void Optimizer::load_state(const NamedTensors& saved) {
  NamedTensors current = state();
  if (saved.size() != current.size())
    throw DataError(fmt::format("checkpoint optimizer state has {} tensors, this optimizer {}: was it saved with another "
                                "optim.name or model?",
                                saved.size(), current.size()));
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : current) {
    const torch::Tensor* stored = find_tensor(saved, name);
    if (!stored) throw DataError(fmt::format("checkpoint optimizer state lacks \"{}\"", name));
    if (stored->sizes() != tensor.sizes())
      throw DataError(fmt::format("checkpoint optimizer state \"{}\" has shape {}, expected {}", name,
                                  fmt::join(stored->sizes(), "x"), fmt::join(tensor.sizes(), "x")));
    tensor.copy_(*stored);
  }
}

std::vector<ParamGroup> make_param_groups(const NamedTensors& named_parameters, double weight_decay,
                                          bool no_decay_norm_and_bias) {
  ParamGroup decay{{}, {}, weight_decay};
  ParamGroup no_decay{{}, {}, 0.0};
  for (const auto& [name, param] : named_parameters) {
    if (!param.requires_grad()) continue;
    ParamGroup& group = no_decay_norm_and_bias && param.dim() <= 1 ? no_decay : decay;
    group.names.push_back(name);
    group.params.push_back(param);
  }
  std::vector<ParamGroup> groups;
  for (auto* group : {&decay, &no_decay})
    if (!group->params.empty()) groups.push_back(std::move(*group));
  return groups;
}

std::unique_ptr<Optimizer> make_optimizer(const config::OptimSection& options, const NamedTensors& named_parameters) {
  if (named_parameters.empty()) throw std::invalid_argument("make_optimizer: no parameters");
  const torch::Device device = named_parameters.front().second.device();
  const bool fused = options.fused && device.is_cuda();
  auto groups = make_param_groups(named_parameters, options.weight_decay, options.no_decay_norm_and_bias);
  switch (options.name) {
    case config::OptimizerKind::sgd:
      return std::make_unique<Sgd>(std::move(groups), options, device, ops::sgd_backend(device, options.fused));
    case config::OptimizerKind::adamw:
      return std::make_unique<AdamW>(std::move(groups), options, device, fused && compat::has_fused_optimizers());
  }
  throw std::invalid_argument("make_optimizer: unknown optimizer");
}

}  // namespace ltrain::optim
