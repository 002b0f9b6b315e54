#include "ltrain/optim/optimizer.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/core/errors.h"

namespace ltrain::optim {
namespace {

/// torch.optim.SGD (dampening 0, not maximizing). The momentum buffer starts at zero, which
/// equals PyTorch's "first step copies the gradient": momentum * 0 + g == g exactly.
class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, const config::OptimSection& options, const torch::Device& device)
      : Optimizer(std::move(groups), device), momentum_(options.momentum), nesterov_(options.nesterov) {
    if (momentum_ == 0.0) return;
    for (const auto& group : groups_)
      for (size_t i = 0; i < group.params.size(); ++i)
        momentum_buffers_.emplace_back("momentum_buffer/" + group.names[i], torch::zeros_like(group.params[i]));
  }

  void step() override {
    torch::NoGradGuard no_grad;
    size_t buffer_index = 0;
    for (const auto& group : groups_) {
      for (const auto& param : group.params) {
        // d = g + weight_decay * p   (L2 penalty folded into the gradient)
        torch::Tensor direction = group.weight_decay != 0.0 ? param.grad().add(param, group.weight_decay)
                                                            : param.grad();
        if (momentum_ != 0.0) {
          torch::Tensor& buffer = momentum_buffers_[buffer_index++].second;
          buffer.mul_(momentum_).add_(direction);
          direction = nesterov_ ? direction.add(buffer, momentum_) : buffer;
        }
        param.addcmul_(direction, lr_, -1.0);  // p -= lr * d, with lr read on the device
      }
    }
  }

  NamedTensors state() const override { return momentum_buffers_; }

 private:
  double momentum_;
  bool nesterov_;
  NamedTensors momentum_buffers_;  // one per parameter, in group order
};

/// torch.optim.AdamW (amsgrad off). The step count lives on the device so that bias
/// corrections need no host value.
class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, const config::OptimSection& options, const torch::Device& device)
      : Optimizer(std::move(groups), device),
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

  void step() override {
    torch::NoGradGuard no_grad;
    step_count_.add_(1.0);
    // 0-dim device tensors: 1 - beta^t for the bias corrections.
    const torch::Tensor correction1 = 1.0 - torch::pow(beta1_, step_count_);
    const torch::Tensor correction2_sqrt = torch::sqrt(1.0 - torch::pow(beta2_, step_count_));
    const torch::Tensor step_size = lr_ / correction1;
    size_t index = 0;
    for (const auto& group : groups_) {
      const torch::Tensor decay_factor = 1.0 - lr_ * group.weight_decay;
      for (const auto& param : group.params) {
        const torch::Tensor& grad = param.grad();
        torch::Tensor& m = exp_avg_[index].second;
        torch::Tensor& v = exp_avg_sq_[index].second;
        ++index;
        param.mul_(decay_factor);                    // decoupled weight decay
        m.lerp_(grad, 1.0 - beta1_);                 // m = b1 m + (1 - b1) g
        v.mul_(beta2_).addcmul_(grad, grad, 1.0 - beta2_);  // v = b2 v + (1 - b2) g^2
        const torch::Tensor denom = (v.sqrt() / correction2_sqrt).add_(eps_);
        param.addcdiv_(m * step_size, denom, -1.0);  // p -= lr / c1 * m / denom
      }
    }
  }

  NamedTensors state() const override {
    NamedTensors out{{"step", step_count_}};
    out.insert(out.end(), exp_avg_.begin(), exp_avg_.end());
    out.insert(out.end(), exp_avg_sq_.begin(), exp_avg_sq_.end());
    return out;
  }

 private:
  double beta1_;
  double beta2_;
  double eps_;
  torch::Tensor step_count_;  // 0-dim float32 on the device
  NamedTensors exp_avg_;
  NamedTensors exp_avg_sq_;
};

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, const torch::Device& device)
    : groups_(std::move(groups)), lr_(torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device))) {}

void Optimizer::zero_grad() {
  torch::NoGradGuard no_grad;
  for (const auto& group : groups_)
    for (const auto& param : group.params)
      if (param.grad().defined()) param.mutable_grad().zero_();
}

void Optimizer::load_state(const NamedTensors& saved) {
  NamedTensors current = state();
  if (saved.size() != current.size())
    throw DataError(fmt::format("checkpoint optimizer state has {} tensors, this optimizer {}: was it saved with another "
                                "optim.name or model?",
                                saved.size(), current.size()));
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : current) {
    auto it = std::find_if(saved.begin(), saved.end(), [&](const auto& entry) { return entry.first == name; });
    if (it == saved.end()) throw DataError(fmt::format("checkpoint optimizer state lacks \"{}\"", name));
    if (it->second.sizes() != tensor.sizes())
      throw DataError(fmt::format("checkpoint optimizer state \"{}\" has shape {}, expected {}", name,
                                  fmt::join(it->second.sizes(), "x"), fmt::join(tensor.sizes(), "x")));
    tensor.copy_(it->second);
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
  auto groups = make_param_groups(named_parameters, options.weight_decay, options.no_decay_norm_and_bias);
  switch (options.name) {
    case config::OptimizerKind::sgd:
      return std::make_unique<Sgd>(std::move(groups), options, device);
    case config::OptimizerKind::adamw:
      return std::make_unique<AdamW>(std::move(groups), options, device);
  }
  throw std::invalid_argument("make_optimizer: unknown optimizer");
}

}  // namespace ltrain::optim
